"""Where runs, feature shards and models live: a local folder or object storage, one way to reach both.

A :class:`Location` is a place as the user wrote it (``results``, ``/mnt/runs``, ``s3://bucket/runs``)
together with the ``pyarrow.fs`` file system that reaches it and the path on that file system.  Every
module that reads or writes storage takes a Location, so a URI is never turned into a local
``Path`` (``Path("s3://b/x")`` is the local folder ``s3:/b/x``).

Object storage (``s3://``) goes through one ``pyarrow.fs.S3FileSystem`` per process and endpoint,
with a bounded retry strategy and connect and request timeouts; Ray Train and Tune get that same
object as ``storage_filesystem``, Ray Data as ``filesystem``.  Its settings are the AWS SDKs' own
variables, so that the AWS CLI, boto3 and this service agree on where a bucket is:

* endpoint: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``; neither = AWS itself.  Any
  S3-compatible service (MinIO, Ceph, R2) works.  Ray workers get these two variables through the
  runtime environment (``placement/session.py:worker_env``): they are addresses, not secrets.
* region: ``AWS_REGION``, else ``AWS_DEFAULT_REGION``.
* credentials: only ever the standard AWS chain (environment, ``~/.aws`` files, a web-identity
  token as with EKS IRSA, container or instance roles), resolved by the AWS SDK wherever the file
  system is used.  The file system object holds no keys, so pickling it to Ray workers carries
  none; nothing here puts keys in runtime_env variables, logs, metadata or reports, and a URI with
  keys in it (``s3://KEY:SECRET@bucket``) is refused.

:func:`preflight` checks, before any work starts, what would otherwise fail late: credentials (the
AWS SDK's own resolver, botocore), an endpoint that answers, a bucket that exists.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from alchemetric_ray.errors import StorageError
from alchemetric_ray.fsutil import atomic_write_bytes, is_uri, staged_dir

# One S3 request: connect within 5 s, no 20 s without a byte moving, 4 attempts with the SDK's
# backoff.  The preflight probe makes one attempt with a short read timeout, so that an endpoint
# that accepts connections and never answers is reported within PROBE_TIMEOUT_S.
S3_CONNECT_TIMEOUT_S = 5.0
S3_REQUEST_TIMEOUT_S = 20.0
S3_MAX_ATTEMPTS = 4
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Location:
    """A folder or file on some file system: ``uri`` for people, ``filesystem`` + ``path`` for code."""

    uri: str  # as given (a URI, or a local path made absolute)
    filesystem: Any  # a pyarrow.fs.FileSystem
    path: str  # the path on ``filesystem``: "bucket/prefix" on S3, an absolute path locally

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:
        """A local location is path-like (``Path(loc)``, ``open(loc)``); one on object storage is not,
        so that a URI can never become a local folder by accident."""
        if not self.is_local:
            raise TypeError(f"{self.uri} is on object storage, not a local path")
        return self.path

    @property
    def is_local(self) -> bool:
        from pyarrow import fs

        return isinstance(self.filesystem, fs.LocalFileSystem)

    @property
    def local(self) -> Path:
        """The local folder or file; a StorageError where the location is on object storage."""
        if not self.is_local:
            raise StorageError(f"{self.uri} is not a local path")
        return Path(self.path)

    def __truediv__(self, name: str) -> Location:
        return Location(f"{self.uri.rstrip('/')}/{name}", self.filesystem, posixpath.join(self.path, name))

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    # ---- what is there ----

    def _type(self):
        try:
            return self.filesystem.get_file_info(self.path).type
        except OSError as exc:
            raise StorageError(f"{self.uri}: {_first_line(exc)}") from None

    def exists(self) -> bool:
        from pyarrow import fs

        return self._type() != fs.FileType.NotFound

    def is_file(self) -> bool:
        from pyarrow import fs

        return self._type() == fs.FileType.File

    def is_dir(self) -> bool:
        from pyarrow import fs

        return self._type() == fs.FileType.Directory

    def listing(self, pattern: str = "*", *, folders: bool) -> list[str]:
        """Names of the folders (or files) directly in this folder that match ``pattern``, sorted."""
        from pyarrow import fs

        try:
            infos = self.filesystem.get_file_info(fs.FileSelector(self.path, allow_not_found=True))
        except OSError as exc:
            raise StorageError(f"{self.uri}: {_first_line(exc)}") from None
        kind = fs.FileType.Directory if folders else fs.FileType.File
        return sorted(i.base_name for i in infos if i.type == kind and fnmatch.fnmatch(i.base_name, pattern))

    # ---- reading and writing ----

    def read_bytes(self) -> bytes:
        try:
            with self.filesystem.open_input_stream(self.path) as stream:
                return stream.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"{self.uri}: {_first_line(exc)}") from None

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def write_bytes(self, data: bytes) -> None:
        """Write the whole file at once: a local file is renamed into place, an object is one PUT
        (object stores make it visible whole or not at all).  A full local disk is one
        ``fsutil.DiskFullError`` line."""
        if self.is_local:
            self.local.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.local, data)
            return
        try:
            with self.filesystem.open_output_stream(self.path) as out:
                out.write(data)
        except OSError as exc:
            raise StorageError(f"{self.uri}: {_first_line(exc)}") from None

    def write_json(self, obj: Any) -> None:
        self.write_bytes(json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    @contextmanager
    def staged(self, *, last: tuple[str, ...] = ()) -> Iterator[Path]:
        """``with loc.staged() as stage:`` build a local folder that then replaces this location
        whole (``fsutil.staged_dir``); files named in ``last`` are put in place after all others.
        An output a command writes goes through ``outputs.staged_output``, which first makes sure
        that what it replaces is the product's own; this is for a folder inside one the product made
        and names itself (a run's ``epoch-NNNN`` checkpoint)."""
        target = self.local if self.is_local else self.path
        with staged_dir(target, None if self.is_local else self.filesystem, last=last) as stage:
            yield stage

    def download(self, into: Path) -> Path:
        """Copy this folder to the local folder ``into`` (which must not exist yet); return it."""
        from pyarrow import fs

        if self.is_local:
            return self.local
        into.mkdir(parents=True)
        try:
            fs.copy_files(self.path, str(into), source_filesystem=self.filesystem,
                          destination_filesystem=fs.LocalFileSystem())
        except OSError as exc:
            raise StorageError(f"{self.uri}: {_first_line(exc)}") from None
        return into


@contextmanager
def local_copy(where: str | Path | Location) -> Iterator[Path]:
    """A local path to read ``where`` from: the path itself, or a temporary copy of a file or folder
    on object storage (removed when the block ends).  For inputs that a library reads by path."""
    where = locate(where)
    if where.is_local:
        yield where.local
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="alchemetric-input-") as tmp:
        copy = Path(tmp) / (where.name or "input")
        if where.is_file():
            copy.write_bytes(where.read_bytes())
        elif where.is_dir():
            where.download(copy)
        else:
            raise StorageError(f"{where}: no such file or folder")
        yield copy


def locate(where: str | Path | Location) -> Location:
    """The Location of a local path or a URI (``s3://bucket/prefix``, ``file:///...``, ``gs://...``)."""
    if isinstance(where, Location):
        return where
    text = str(where)
    if not is_uri(text):
        from pyarrow import fs

        return Location(text, fs.LocalFileSystem(), str(Path(text).resolve()))
    parts = urlsplit(text)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        shown = f"{parts.scheme}://***@{parts.netloc.rpartition('@')[2]}{parts.path}"
        raise StorageError(f"{shown}: a storage URI must not hold credentials; remove them from the URI and "
                           "use the AWS credential chain (environment, ~/.aws, an instance or pod role)")
    if parts.scheme == "s3":
        if not parts.netloc:
            raise StorageError(f"{text}: no bucket name (expected s3://BUCKET/PREFIX)")
        path = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
        return Location(text.rstrip("/"), s3_filesystem(*s3_settings()), path)
    from pyarrow import fs

    try:
        filesystem, path = fs.FileSystem.from_uri(text)
    except (ValueError, OSError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise StorageError(f"{text}: {_first_line(exc)}") from None
    return Location(text.rstrip("/") if not isinstance(filesystem, fs.LocalFileSystem) else path,
                    filesystem, path)


S3_SETTINGS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")


def s3_settings() -> tuple[str | None, str | None]:
    """(endpoint, region) for S3 from the AWS SDKs' variables; None where unset."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    return endpoint, region


@lru_cache(maxsize=8)
def s3_filesystem(endpoint: str | None, region: str | None, *, probe: bool = False):
    """The process's S3 file system for one endpoint and region (``probe``: one short attempt)."""
    from pyarrow import fs

    options: dict[str, Any] = {
        "connect_timeout": S3_CONNECT_TIMEOUT_S,
        "request_timeout": PROBE_TIMEOUT_S if probe else S3_REQUEST_TIMEOUT_S,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=1 if probe else S3_MAX_ATTEMPTS),
    }
    if endpoint:
        options["endpoint_override"] = endpoint
    if region:
        options["region"] = region
    return fs.S3FileSystem(**options)


def preflight(location: Location) -> None:
    """Refuse, in one line, object storage we cannot use: no credentials, an endpoint that does not
    answer (within about PROBE_TIMEOUT_S), a bucket that does not exist.  Local paths pass."""
    if location.is_local or not location.uri.startswith("s3://"):
        return
    check_credentials(location.uri)
    endpoint, region = s3_settings()
    where = f"endpoint {endpoint}" if endpoint else "AWS S3"
    bucket = location.path.split("/", 1)[0]
    from pyarrow import fs

    try:
        found = s3_filesystem(endpoint, region, probe=True).get_file_info(bucket).type
    except OSError as exc:
        raise StorageError(f"{location.uri}: cannot reach object storage at {where} ({_first_line(exc)[:200]})") \
            from None
    if found == fs.FileType.NotFound:
        raise StorageError(f"{location.uri}: bucket '{bucket}' does not exist at {where}")


def check_credentials(uri: str) -> None:
    """The AWS credential chain must give credentials (botocore resolves it as every AWS SDK does)."""
    if not _has_credentials():
        raise StorageError(f"{uri}: no AWS credentials found (environment variables, ~/.aws files, web identity, "
                           "container or instance role); set them up before using object storage")


def _has_credentials() -> bool:
    from botocore.exceptions import BotoCoreError
    from botocore.session import Session

    try:
        return Session().get_credentials() is not None
    except BotoCoreError:  # e.g. AWS_PROFILE names a profile that does not exist
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
