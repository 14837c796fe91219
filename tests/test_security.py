"""Security: crafted pickles never run, names cannot leave their folder, no secrets, a loopback dashboard.

* A checkpoint's ``state.pt`` and a saved model's ``weights.pt`` are loaded with
  ``torch.load(weights_only=True)``: a file whose pickle would run code when unpickled the unsafe
  way is refused with a one-line error naming the file, through every loader (checkpoint, export,
  ``load_model``, the CLI's ``predict`` / ``evaluate --model``), and the code never runs.
* Names that become paths (model and run names, model names, tickers from file names and from a
  ticker column) are refused with one line, and nothing is written outside the intended folder.
* No token or private key is committed.
* Every example and test binds the Ray dashboard to 127.0.0.1 and leaves token authentication on;
  the test session's own Ray proves it live: the dashboard listens on loopback only and refuses an
  API request without the token.
"""

import ast
import contextlib
import dataclasses
import json
import pickle
import re
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import torch

from alchemetric_ray.artifacts.checkpoint import load_state, save_checkpoint
from alchemetric_ray.artifacts.export import export_model, load_model
from alchemetric_ray.cli import main
from alchemetric_ray.config import load_config
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import CheckpointError, UnsafeNameError, UserError
from alchemetric_ray.fsutil import safe_child
from alchemetric_ray.models import build_model

REPO = Path(__file__).resolve().parents[1]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


def _one_line_cli_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"alchemetric-ray {command}: error: "), err
    return err


# ---- 1. crafted pickles ---------------------------------------------------------------------------


class _RunsCode:
    """Unpickled the unsafe way (weights_only=False), this writes ``marker``: arbitrary code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _write_crafted(path: Path, marker: Path, fmt: str) -> None:
    payload = {"model": {"weight": torch.zeros(2)}, "extra": _RunsCode(marker)}
    if fmt == "torch.save":  # the zip format torch.save writes, with the payload inside data.pkl
        torch.save(payload, path)
    else:  # a bare pickle stream (torch.load's legacy format)
        path.write_bytes(pickle.dumps(payload))


def _assert_payload_is_live(path: Path, marker: Path) -> None:
    """The control: the same file, loaded the unsafe way, does run the code."""
    assert not marker.exists()
    with contextlib.suppress(Exception):  # the legacy format fails after unpickling: the code ran by then
        torch.load(path, map_location="cpu", weights_only=False)
    assert marker.read_text() == "pwned"


def _tiny_model_folder(folder: Path) -> None:
    """A complete saved-model folder (what export_model writes), small enough to build by hand."""
    cfg = load_config(None, ["model.name=mlp", "model.hidden=8", "storage.name=tiny"])
    manifest = Manifest(features=["f0", "f1", "f2"], label={"classes": ["down", "flat", "up"]}, splits={},
                        normalization={}, rows={}).to_dict()
    folder.mkdir(parents=True)
    torch.save({"model": build_model(cfg.model, 3, 3).state_dict()}, folder / "weights.pt")
    (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "meta.json").write_text(json.dumps({"epoch": 0}))


@pytest.mark.parametrize("fmt", ["torch.save", "pickle"])
def test_crafted_checkpoint_state_is_refused_and_never_runs(tmp_path, fmt):
    cfg = load_config(None, ["model.name=mlp", "model.hidden=8", f"storage.models_dir={tmp_path / 'models'}"])
    model = build_model(cfg.model, 3, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    ckpt = tmp_path / "run" / "epoch-0000"
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "scaler": torch.amp.GradScaler("cpu").state_dict(), "epoch": torch.tensor(0)}
    save_checkpoint(ckpt, state, {"epoch": 0})
    assert load_state(ckpt)["optimizer"]["state"]  # an honest checkpoint loads, optimizer state and all

    marker = tmp_path / "marker"
    _write_crafted(ckpt / "state.pt", marker, fmt)
    with pytest.raises(CheckpointError) as err:
        load_state(ckpt)  # what a resumed run and the export read
    message = str(err.value)
    assert message.startswith(f"{ckpt / 'state.pt'}: refused to load (") and "\n" not in message
    assert isinstance(err.value, UserError)
    with pytest.raises(CheckpointError, match="state.pt: refused to load"):
        export_model(ckpt, cfg, tmp_path / "no-shards")  # exporting the checkpoint as a model
    assert not marker.exists()  # the code never ran
    assert not (tmp_path / "models").exists()
    _assert_payload_is_live(ckpt / "state.pt", marker)


@pytest.mark.parametrize("fmt", ["torch.save", "pickle"])
def test_crafted_model_weights_are_refused_by_load_model_and_the_cli(tmp_path, capsys, fmt):
    model_dir = tmp_path / "models" / "tiny"
    _tiny_model_folder(model_dir)
    assert load_model(model_dir).config.model.name == "mlp"  # the honest folder loads

    marker = tmp_path / "marker"
    _write_crafted(model_dir / "weights.pt", marker, fmt)
    with pytest.raises(CheckpointError) as err:
        load_model(model_dir)
    assert str(err.value).startswith(f"{model_dir / 'weights.pt'}: refused to load (") and "\n" not in str(err.value)
    for command in ("predict", "evaluate"):
        out = tmp_path / f"{command}-out"
        assert main([command, "--model", str(model_dir), "--out", str(out)]) == 2
        err_line = _one_line_cli_error(capsys, command)
        assert f"{model_dir / 'weights.pt'}: refused to load" in err_line
        assert not out.exists()
    assert not marker.exists()  # the code never ran
    _assert_payload_is_live(model_dir / "weights.pt", marker)


def _product_sources() -> list[Path]:
    return sorted(p for top in ("alchemetric_ray", "jobs", "scripts", "bench") for p in (REPO / top).rglob("*.py"))


def test_every_load_in_the_product_is_weights_only():
    torch_loads, unsafe = [], []
    for path in _product_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = ast.unparse(node.func)
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if func == "torch.load":
                torch_loads.append(where)
                weights_only = [k.value for k in node.keywords if k.arg == "weights_only"]
                if not (weights_only and isinstance(weights_only[0], ast.Constant) and weights_only[0].value is True):
                    unsafe.append(f"{where}: torch.load without weights_only=True")
            elif func in ("pickle.load", "pickle.loads", "cloudpickle.load", "cloudpickle.loads", "joblib.load",
                          "dill.load", "dill.loads", "np.load", "numpy.load", "pd.read_pickle", "yaml.load"):
                unsafe.append(f"{where}: {func}")
    # exactly two loaders: the checkpoint's state.pt and the saved model's weights.pt
    assert {w.split(":")[0] for w in torch_loads} == {"alchemetric_ray/artifacts/checkpoint.py",
                                                      "alchemetric_ray/artifacts/export.py"}, torch_loads
    assert unsafe == []
    # the training loop resumes only through the checked loader
    loop_src = (REPO / "alchemetric_ray" / "training" / "loop.py").read_text()
    assert "load_state(ckpt_dir)" in loop_src and "torch.load" not in loop_src


# ---- 2. names that become paths --------------------------------------------------------------------

ESCAPES = ["../../evil", "..", "a/b", "a/../../evil", "/tmp/evil-abs", "..\\evil"]


@pytest.mark.parametrize("key", ["storage.name", "storage.run"])
@pytest.mark.parametrize("command", ["train", "tune", "features"])
def test_model_and_run_names_cannot_escape_on_the_cli(tmp_path, monkeypatch, capsys, command, key):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # the default storage.path and models_dir are relative to here
    for name in ESCAPES:
        argv = [command, "--data", str(tmp_path / "no-data"), f"{key}={name}", f"storage.path={work / 'results'}",
                f"storage.models_dir={work / 'models'}"]
        if command == "features":
            argv += ["--out", str(work / "shards")]
        assert main(argv) == 2, name
        err = _one_line_cli_error(capsys, command)
        assert f"config '{key}'" in err and "is invalid" in err, err
    assert _tree(tmp_path) == {"work"}  # nothing was written anywhere
    assert not Path("/tmp/evil-abs").exists()


def test_model_name_cannot_name_a_path(capsys):
    assert main(["train", "model.name=../../mlp"]) == 2
    err = _one_line_cli_error(capsys, "train")
    assert "unknown model '../../mlp'" in err


@pytest.mark.parametrize("name", [*ESCAPES, "", ".hidden", "x..y"])
def test_the_path_helpers_refuse_names_the_config_never_saw(tmp_path, name):
    """Defence in depth: a config built without validation (a library caller) is refused again
    where the name becomes a path."""
    from alchemetric_ray.placement.session import run_name
    from alchemetric_ray.training.trainer import prepare_shards

    with pytest.raises(UnsafeNameError) as err:
        safe_child(tmp_path, name, "storage.name")
    assert "\n" not in str(err.value) and isinstance(err.value, UserError)
    base = load_config(None, [f"storage.path={tmp_path / 'results'}", f"data.path={tmp_path / 'raw'}"])
    bad_name = dataclasses.replace(base, storage=dataclasses.replace(base.storage, name=name))
    bad_run = dataclasses.replace(base, storage=dataclasses.replace(base.storage, run=name or "..."))
    for call in (lambda: run_name(bad_name), lambda: run_name(bad_run), lambda: run_name(bad_name, sweep=True),
                 lambda: run_name(bad_run, sweep=True), lambda: prepare_shards(bad_name, progress=False)):
        with pytest.raises(UnsafeNameError, match=r"^storage\.(name|run) .* is not a plain name"):
            call()
    assert _tree(tmp_path) == set()


def _long_table(stocknet_dir: Path, names: dict[str, str]) -> pd.DataFrame:
    """Rows of real tickers, each labelled with the name given for it."""
    return pd.concat([pd.read_csv(stocknet_dir / f"{real}.csv").assign(ticker=label) for real, label in names.items()])


@pytest.mark.parametrize("evil", ["../x", "../../x", "/tmp/evil-ticker", "..", "a/b", "..\\x", ".x"])
def test_ticker_from_a_data_column_cannot_escape(stocknet_dir, tmp_path, capsys, evil):
    data = tmp_path / "in" / "prices.csv"
    data.parent.mkdir()
    _long_table(stocknet_dir, {"AAPL": "AAPL", "MSFT": evil}).to_csv(data, index=False)
    out = tmp_path / "out" / "shards"
    assert main(["features", "--data", str(data), "--out", str(out), "--quiet"]) == 2
    err = _one_line_cli_error(capsys, "features")
    assert f"unsafe ticker name {evil!r}" in err and "prices.csv" in err
    assert _files(tmp_path) == {"in/prices.csv"}  # no shard or staging file anywhere, inside or outside out/
    assert _tree(tmp_path) <= {"in", "in/prices.csv", "out"}  # at most the (empty) parent of --out
    assert not Path("/tmp/evil-ticker.parquet").exists()


@pytest.mark.parametrize("file_name", ["a\\..\\..\\x.csv", "x..y.csv", "AA PL.csv"])
def test_ticker_from_a_file_name_cannot_escape(stocknet_dir, tmp_path, capsys, file_name):
    folder = tmp_path / "in"
    folder.mkdir()
    raw = pd.read_csv(stocknet_dir / "AAPL.csv")
    raw.to_csv(folder / "AAPL.csv", index=False)
    raw.to_csv(folder / file_name, index=False)
    assert main(["features", "--data", str(folder), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = _one_line_cli_error(capsys, "features")
    assert f"unsafe ticker name {Path(file_name).stem!r}" in err
    assert _files(tmp_path) == {"in/AAPL.csv", f"in/{file_name}"}
    assert _tree(tmp_path) <= {"in", "in/AAPL.csv", f"in/{file_name}", "out"}


def test_a_hidden_file_is_never_a_ticker(stocknet_dir, tmp_path):
    # "..x.csv" would be the ticker "..x": a dot file is not data, so it is skipped, not used
    folder = tmp_path / "in"
    folder.mkdir()
    raw = pd.read_csv(stocknet_dir / "AAPL.csv")
    raw.to_csv(folder / "AAPL.csv", index=False)
    raw.to_csv(folder / "..x.csv", index=False)
    out = tmp_path / "out"
    assert main(["features", "--data", str(folder), "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "manifest.json").read_text())["tickers"] == ["AAPL"]
    assert {f for f in _files(tmp_path) if not f.startswith("out/")} == {"in/AAPL.csv", "in/..x.csv"}


# ---- 3. no committed secrets -----------------------------------------------------------------------

_SECRET_NAME = r"[\w.-]*(?:token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|private[_-]?key|credential)s?[\w.-]*"
SECRET_PATTERNS = {
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "aws_secret_access_key": re.compile(r"(?i)aws_secret_access_key\s*[=:]\s*['\"]?[A-Za-z0-9/+=]{20,}"),
    "GitHub token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "OpenAI/Anthropic-style key": re.compile(r"\bsk-(?:ant-)?[A-Za-z0-9_-]{20,}"),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "Ray token in the environment": re.compile(r"RAY_AUTH_TOKEN\s*=\s*['\"]?[A-Za-z0-9_-]{8,}"),
    "secret-named value": re.compile(rf"(?i)\b{_SECRET_NAME}['\"]?\s*[:=]\s*['\"]?([A-Za-z0-9+/_=-]{{20,}})"),
}
SECRET_FILE_NAMES = re.compile(r"(?i)(^|/)(auth_token|\.env|\.netrc|id_(rsa|dsa|ecdsa|ed25519)|credentials)$"
                               r"|\.(pem|key|p12|pfx)$")


def _looks_random(value: str) -> bool:
    return bool(re.search(r"[0-9]", value)) and bool(re.search(r"[A-Za-z]", value))


def _secrets_in(text: str) -> list[str]:
    found = []
    for what, pattern in SECRET_PATTERNS.items():
        for m in pattern.finditer(text):
            if what == "secret-named value" and not _looks_random(m.group(1)):
                continue  # a word like token_authentication, not a value
            found.append(f"{what}: {m.group(0)[:12]}...")
    return found


def _files_to_commit() -> list[str]:
    def ls(*args):
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", *args], capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return [f for f in out.stdout.decode().split("\0") if f]

    return sorted(set(ls()) | set(ls("--others", "--exclude-standard")))


def test_secret_scanner_finds_what_it_looks_for():
    # built at run time, so that this file itself holds no secret-shaped text
    assert _secrets_in("-----BEGIN " + "OPENSSH PRIVATE KEY-----")
    assert _secrets_in("export RAY_AUTH_" + "TOKEN=4f9c2a7e1b")
    assert _secrets_in("gh" + "p_" + "a1B2" * 9)
    assert _secrets_in("AKIA" + "ABCDEFGH12345678")
    assert _secrets_in('api_' + 'key = "' + "Zx81" * 6 + '"')
    assert _secrets_in("db_pass" + "word: " + "hunter2hunter2hunter2x")
    # what the repository legitimately holds
    assert not _secrets_in('monkeypatch.setenv("RAY_AUTH_TOKEN", "secret-value")')
    assert not _secrets_in('env["RAY_AUTH_TOKEN_PATH"] = "/home/ray/.ray/auth_token"')
    assert not _secrets_in("token_authentication = enabled_by_default_for_local_clusters")
    assert SECRET_FILE_NAMES.search("deploy/id_ed25519") and SECRET_FILE_NAMES.search("ray/auth_token")
    assert not SECRET_FILE_NAMES.search("tests/test_security.py")


def test_no_secret_is_committed():
    files = _files_to_commit()
    assert "alchemetric_ray/cli.py" in files and "tests/test_security.py" in files
    hits = [f for f in files if SECRET_FILE_NAMES.search(f)]
    for name in files:
        path = REPO / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        hits += [f"{name}: {hit}" for hit in _secrets_in(data.decode("utf-8", errors="replace"))]
    assert hits == []


# ---- 4. the dashboard: loopback only, token authentication on --------------------------------------

SCANNED = ("tests", "jobs", "alchemetric_ray", "scripts", "bench", "docs", "README.md", "cluster.yaml", "Makefile")


def _scanned_files() -> list[str]:
    return [f for f in _files_to_commit() if f.split("/")[0] in SCANNED and (REPO / f).is_file()]


def _ray_init_problems(path: str, tree: ast.AST) -> list[str]:
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "ray.init":
            kw = {k.arg: k.value for k in node.keywords}
            joins = node.args or "address" in kw  # joins a running cluster: starts no dashboard
            off = isinstance(kw.get("include_dashboard"), ast.Constant) and kw["include_dashboard"].value is False
            host = kw.get("dashboard_host")
            loopback = isinstance(host, ast.Constant) and host.value == "127.0.0.1"
            if not (joins or off or loopback):
                problems.append(f"{path}:{node.lineno}: {ast.unparse(node)[:120]}")
        if isinstance(node, (ast.List, ast.Tuple)):  # subprocess argv of `ray start --head ...`
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if "start" in words and "--head" in words and "--dashboard-host=127.0.0.1" not in words:
                problems.append(f"{path}:{node.lineno}: ray start --head without --dashboard-host=127.0.0.1")
    return problems


def _text_problems(path: str, text: str) -> list[str]:
    problems = []
    for i, line in enumerate(text.splitlines(), 1):
        if re.search(r"\bray start\b.*--head", line) and "--dashboard-host=127.0.0.1" not in line:
            problems.append(f"{path}:{i}: {line.strip()[:120]}")
        if re.search(r"\bray\.init\([^)]", line) and not re.search(r"address=|dashboard_host=[\"']127\.0\.0\.1", line):
            problems.append(f"{path}:{i}: {line.strip()[:120]}")
    return problems


EXPOSED = re.compile(r"dashboard[_-]host[\"']?\s*[=:,]\s*[\"']?(?!127\.0\.0\.1)[0-9a-fA-F:.]*[0-9]")
AUTH_OFF = re.compile(r"RAY_AUTH_MODE[\"']?\s*[=:,]\s*[\"']?(?i:disabled)")


def test_dashboard_scan_finds_what_it_looks_for():
    assert _ray_init_problems("x.py", ast.parse("ray.init(num_cpus=2)"))
    assert _ray_init_problems("x.py", ast.parse("ray.init(dashboard_host='" + "0.0.0.0')"))
    assert _ray_init_problems("x.py", ast.parse("subprocess.run(['ray', 'start', '--head'])"))
    assert not _ray_init_problems("x.py", ast.parse("ray.init(include_dashboard=True, dashboard_host='127.0.0.1')"))
    assert not _ray_init_problems("x.py", ast.parse("ray.init(address=os.environ['RAY_ADDRESS'])"))
    assert _text_problems("README.md", "  - ray start --head --port=6379")
    assert not _text_problems("cluster.yaml", "  - ray start --address=$RAY_HEAD_IP:6379")
    assert EXPOSED.search("--dashboard-host=" + "0.0.0.0") and EXPOSED.search("dashboard_host=" + "'10.0.0.5'")
    assert not EXPOSED.search("--dashboard-host=127.0.0.1")
    assert AUTH_OFF.search("RAY_AUTH_" + "MODE=disabled") and AUTH_OFF.search('{"RAY_AUTH_' + 'MODE": "DISABLED"}')


@pytest.mark.slow
def test_every_example_and_test_binds_the_dashboard_to_loopback_with_token_auth():
    files = _scanned_files()
    assert {"tests/conftest.py", "alchemetric_ray/placement/session.py", "cluster.yaml", "README.md"} <= set(files)
    problems, inits = [], 0
    for name in files:
        text = (REPO / name).read_text(errors="replace")
        if name.endswith(".py"):
            tree = ast.parse(text, name)
            inits += sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "ray.init")
            problems += _ray_init_problems(name, tree)
        else:
            problems += _text_problems(name, text)
        problems += [f"{name}: {m.group(0)}" for m in EXPOSED.finditer(text)]
        problems += [f"{name}: token authentication switched off ({m.group(0)})" for m in AUTH_OFF.finditer(text)]
    assert inits >= 3  # the scan saw the product's, the harness's and the tests' ray.init calls
    assert problems == []
    head = "\n".join(line for line in (REPO / "cluster.yaml").read_text().splitlines() if "ray start --head" in line)
    assert "--dashboard-host=127.0.0.1" in head


def _non_loopback_ipv4() -> list[str]:
    import psutil

    return sorted({a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                   if a.family == socket.AF_INET and not a.address.startswith("127.")})


def _get(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_session_dashboard_is_loopback_only_and_refuses_requests_without_the_token(ray_session):
    import psutil
    from ray._private.authentication.authentication_utils import is_token_auth_enabled
    from ray._private.authentication.http_token_authentication import (
        get_auth_headers_if_auth_enabled,
    )
    from ray._private.worker import get_dashboard_url

    assert is_token_auth_enabled(), "the session's Ray runs without token authentication"
    host, port = get_dashboard_url().rsplit(":", 1)
    port = int(port)
    assert host == "127.0.0.1"
    listening = [c.laddr.ip for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert listening and set(listening) <= {"127.0.0.1", "::1"}, listening
    for ip in _non_loopback_ipv4():  # this machine's other addresses: nothing answers there
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((ip, port), timeout=10).close()

    base = f"http://127.0.0.1:{port}"
    for path in ("/api/version", "/api/jobs/", "/nodes?view=summary", "/api/v0/tasks"):
        assert _get(base + path) == 401, path  # no token: refused
        assert _get(base + path, {"Authorization": "Bearer not-the-token"}) in (401, 403), path
    headers = get_auth_headers_if_auth_enabled({})
    assert headers, "Ray's own client sends no token"
    assert _get(base + "/api/version", headers) == 200  # with the token: answered (so the 401 was the token)
