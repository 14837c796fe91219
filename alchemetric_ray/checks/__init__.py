"""Backend verification: operator coverage, CPU parity, mixed-precision sanity, speed, certificate."""
