"""The static sweep report: rendered in a real headless Chromium, plots not blank, text escaped,
written atomically.  Chromium or Google Chrome is required (on PATH on Linux, or the macOS app;
CI installs Debian's ``chromium``): without one the browser tests fail, they do not skip."""

from __future__ import annotations

import base64
import copy
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib.image import imread

from alchemetric_ray.sweeps import report as report_mod
from alchemetric_ray.sweeps.report import write_sweep_report

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NASTY = "<script>alert(1)</script>"


def _history(vals, losses, log_losses=None):
    rows = []
    for e, (v, loss) in enumerate(zip(vals, losses)):
        row = {"epoch": e + 1, "train_loss": loss, "val_balanced_accuracy": v}  # epochs by number, from 1
        if log_losses is not None and log_losses[e] is not None:
            row["val_log_loss"] = log_losses[e]
        rows.append(row)
    return rows


def make_summary() -> dict:
    """A realistic 4-trial sweep: a best trial, a decent one, a bad lr cut by ASHA after one epoch
    (its loss went NaN), and a trial that crashed before its first epoch."""
    return {
        "name": "sweep-20261129-2200",
        "metric": "val_balanced_accuracy",
        "mode": "max",
        "num_trials": 4,
        "space": {"train.lr": {"grid": [0.001, 0.01, 10.0]},
                  "model.hidden": {"choice": [16, 32]},
                  "model.name": {"choice": ["mlp", "lstm"]}},
        "scheduler": "asha",
        "trials": [
            {"trial_id": "a1b2c3", "config": {"train.lr": 0.001, "model.hidden": 16, "model.name": "mlp"},
             "status": "TERMINATED", "best_value": 0.41, "epochs_run": 3, "stopped_early": False,
             "history": _history([0.35, 0.39, 0.41], [1.09, 1.04, 1.01], [1.08, 1.06, None])},
            {"trial_id": "d4e5f6", "config": {"train.lr": 0.01, "model.hidden": 32, "model.name": "lstm"},
             "status": "TERMINATED", "best_value": 0.38, "epochs_run": 3, "stopped_early": False,
             "history": _history([0.34, 0.38, 0.37], [1.08, 1.02, 0.98], [1.09, 1.07, 1.07])},
            {"trial_id": "bad-lr", "config": {"train.lr": 10.0, "model.hidden": 16, "model.name": "mlp"},
             "status": "TERMINATED", "best_value": float("nan"), "epochs_run": 1, "stopped_early": True,
             "history": [{"epoch": 1, "train_loss": float("nan"), "val_balanced_accuracy": float("nan")}]},
            {"trial_id": "crashed", "config": {"train.lr": 0.01, "model.hidden": 16, "model.name": "lstm"},
             "status": "ERROR", "best_value": None, "epochs_run": 0, "stopped_early": False, "history": []},
        ],
        "best_trial_id": "a1b2c3",
        "classes": ["down", "flat", "up"],
        "best_confusion": [[10, 2, 3], [4, 5, 6], [7, 8, 9]],
        "test_metrics": {"balanced_accuracy": 0.37, "log_loss": 1.07, "n": 45},
        "model_dir": "/srv/models/sweep-20261129-2200",
        "max_epochs": 3,
    }


class _Dom(HTMLParser):
    """Trial rows of ``table#trials > tbody``, every <img> and <script>, and the visible text."""

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self.imgs: list[dict] = []
        self.scripts = 0
        self.text: list[str] = []
        self._table_depth = 0     # >0 while inside table#trials
        self._in_tbody = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            if self._table_depth or a.get("id") == "trials":
                self._table_depth += 1
        elif tag == "tbody" and self._table_depth:
            self._in_tbody = True
        elif tag == "tr" and self._table_depth and self._in_tbody:
            self.rows.append(a)
        elif tag == "img":
            self.imgs.append(a)
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag):
        if tag == "table" and self._table_depth:
            self._table_depth -= 1
        elif tag == "tbody":
            self._in_tbody = False

    def handle_data(self, data):
        self.text.append(data)


def _parse(markup: str) -> _Dom:
    dom = _Dom()
    dom.feed(markup)
    dom.close()
    return dom


def _classes(row: dict) -> list[str]:
    return (row.get("class") or "").split()


# Looked for in this order: these names on PATH (Debian/Ubuntu, Fedora, Homebrew, Google's packages),
# then the fixed paths (the Linux package's binary, the macOS applications).
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_PATHS = ("/usr/bin/chromium",
                  "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
                  "/Applications/Chromium.app/Contents/MacOS/Chromium")
INSTALL_HINT = ("install one: Debian/Ubuntu `sudo apt-get install -y chromium` (`make test-deps` does it as root; "
                "CI installs it), macOS `brew install --cask chromium` or Google Chrome")
MISSING_CHROMIUM = ("headless Chromium or Google Chrome is required for the sweep report tests but none was found "
                    f"(looked for {', '.join(CHROMIUM_NAMES)} on PATH and {', '.join(CHROMIUM_PATHS)}): "
                    f"{INSTALL_HINT}.")


def _find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return next((path for path in CHROMIUM_PATHS if os.access(path, os.X_OK)), None)


def _chromium() -> str:
    found = _find_chromium()
    if not found:
        pytest.fail(MISSING_CHROMIUM)
    return found


def _run_chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    cmd = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    env = dict(os.environ, HOME=str(profile))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return proc


def _assert_not_blank(png: Path, min_std: float = 0.01) -> None:
    img = imread(png)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50, (png, img.shape)
    rgb = img[..., :3]
    assert float(rgb.std()) > min_std, f"{png.name} looks blank (std {rgb.std():.4f})"
    assert bool((rgb != rgb[0, 0]).any()), f"{png.name} is a single colour"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report for ``make_summary()``, written once for the module."""
    base = tmp_path_factory.mktemp("sweep_report")
    summary = make_summary()
    index = write_sweep_report(base / "report", summary)
    return {"summary": summary, "index": index, "base": base}


@pytest.fixture(scope="module")
def rendered(report):
    """``report`` plus its DOM as Chromium built it and a screenshot.  Without Chromium it is None
    and each browser test FAILS in its body (a failure, not a setup error or a skip)."""
    if _find_chromium() is None:
        return None
    base, url = report["base"], report["index"].resolve().as_uri()
    dom_proc = _run_chromium(["--dump-dom", url], base / "profile-dom")
    shot = base / "screenshot.png"
    _run_chromium([f"--screenshot={shot}", "--window-size=1280,4000", url], base / "profile-shot")
    return {**report, "dom": dom_proc.stdout, "screenshot": shot}


def _need(rendered) -> dict:
    if rendered is None:
        pytest.fail(MISSING_CHROMIUM)
    return rendered


def test_missing_chromium_fails_with_install_hint(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    for call in (_chromium, lambda: _need(None)):
        with pytest.raises(pytest.fail.Exception) as failed:
            call()
        message = str(failed.value)
        assert "sudo apt-get install -y chromium" in message and "brew install --cask chromium" in message
        assert all(name in message for name in CHROMIUM_NAMES + CHROMIUM_PATHS)


def test_chromium_found_by_each_name_and_macos_path(monkeypatch):
    # Linux packages name the binary differently; on macOS it is inside the application bundle
    for name in CHROMIUM_NAMES:
        monkeypatch.setattr(shutil, "which", lambda n, *a, want=name, **k: f"/opt/bin/{n}" if n == want else None)
        monkeypatch.setattr(os, "access", lambda *a, **k: False)
        assert _find_chromium() == f"/opt/bin/{name}"
    monkeypatch.setattr(shutil, "which", lambda n, *a, **k: None)
    for path in CHROMIUM_PATHS:
        monkeypatch.setattr(os, "access", lambda p, mode, want=path: p == want and mode == os.X_OK)
        assert _find_chromium() == path


@pytest.mark.slow
def test_chromium_dom_has_one_row_per_trial_and_one_best(rendered):
    rendered = _need(rendered)
    summary, dom = rendered["summary"], _parse(rendered["dom"])
    assert "Sweep report" in rendered["dom"], rendered["dom"][:500]
    trial_rows = [r for r in dom.rows if "trial" in _classes(r)]
    assert len(trial_rows) == len(summary["trials"])
    assert sorted(r["data-trial-id"] for r in trial_rows) == sorted(t["trial_id"] for t in summary["trials"])
    best = [r for r in trial_rows if "best" in _classes(r)]
    assert len(best) == 1
    assert best[0]["data-trial-id"] == summary["best_trial_id"]
    assert dom.scripts == 0


@pytest.mark.slow
def test_chromium_dom_images_exist_and_have_alt(rendered):
    rendered = _need(rendered)
    dom = _parse(rendered["dom"])
    folder = rendered["index"].parent
    files = [img.get("data-file") for img in dom.imgs]
    assert set(files) == {"learning_curves.png", "train_loss.png", "hparams.png", "confusion_matrix.png"}
    for img in dom.imgs:
        # inlined, so that index.html alone renders (MLflow's artifact view serves one file): the same
        # bytes as the PNG beside it
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix), img["src"][:40]
        assert base64.b64decode(img["src"][len(prefix):]) == (folder / img["data-file"]).read_bytes()
        assert (img.get("alt") or "").strip(), f"{img['data-file']} has no alt text"


@pytest.mark.slow
def test_chromium_screenshot_not_blank(rendered):
    rendered = _need(rendered)
    shot = rendered["screenshot"]
    assert shot.is_file(), "chromium wrote no screenshot"
    img = imread(shot)
    assert img.shape[0] >= 1000 and img.shape[1] >= 1000, img.shape
    _assert_not_blank(shot, min_std=0.02)


def test_report_text(report):
    markup = report["index"].read_text(encoding="utf-8")
    dom = _parse(markup)
    text = " ".join(" ".join(dom.text).split())
    assert "sweep-20261129-2200" in text
    assert ("4 configurations tried; ranked on validation val_balanced_accuracy (max); "
            "the test split was used once, for the chosen trial only (a look, recorded in the model folder).") in text
    for col in ("train.lr", "model.hidden", "model.name", "status", "epochs run", "stopped early"):
        assert col in text
    assert "nan" in text                             # the bad-lr trial's NaN best value
    assert "ERROR" in text and "lstm" in text
    assert "1.0700" in text and "balanced_accuracy" in text   # test metrics table
    assert "/srv/models/sweep-20261129-2200" in text
    assert "tr.trial.best td { background:" in markup         # the visible highlight


def test_plots_not_blank(report):
    folder = report["index"].parent
    pngs = sorted(folder.glob("*.png"))
    assert {p.name for p in pngs} == {"learning_curves.png", "train_loss.png", "hparams.png", "confusion_matrix.png"}
    for png in pngs:
        _assert_not_blank(png)


def test_escapes_nasty_strings(tmp_path):
    s = make_summary()
    s["name"] = 'sweep "quoted" & <b>bold</b>'
    s["trials"][0]["trial_id"] = NASTY
    s["best_trial_id"] = NASTY
    s["trials"][1]["config"]["model.name"] = NASTY
    s["trials"][2]["config"]["model.name"] = r"$\bogus{$ <img src=x onerror=alert(1)>"  # mathtext would choke
    s["classes"] = ["<i>down</i>", "flat", "up"]
    s["model_dir"] = "/tmp/<script>x</script>"
    index = write_sweep_report(tmp_path / "report", s)
    markup = index.read_text(encoding="utf-8")
    assert "<script" not in markup.lower()
    assert "<b>bold" not in markup and "<i>down" not in markup and "onerror=alert(1)>" not in markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in markup
    assert "&quot;quoted&quot; &amp;" in markup
    dom = _parse(markup)
    assert dom.scripts == 0
    assert all(img["src"].startswith("data:image/png;base64,") and img["data-file"].endswith(".png")
               and "/" not in img["data-file"] for img in dom.imgs)
    best = [r for r in dom.rows if "best" in _classes(r)]
    assert [r["data-trial-id"] for r in best] == [NASTY]   # the attribute round-trips unescaped
    for png in index.parent.glob("*.png"):
        _assert_not_blank(png)


@pytest.mark.slow
def test_atomic_write_replaces_old_report_and_leaves_no_temp(tmp_path, monkeypatch):
    out = tmp_path / "report"
    write_sweep_report(out, make_summary())
    (out / "stale.png").write_bytes(b"old")
    s = make_summary()
    s["name"] = "second-sweep"
    index = write_sweep_report(out, s)
    assert index == out / "index.html"
    assert "second-sweep" in index.read_text(encoding="utf-8")
    assert not (out / "stale.png").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["report"]   # no .report.tmp-* / .report.old-*

    # a failure while building leaves the previous report whole, and no temp folder
    def boom(*a, **k):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(report_mod, "_confusion_plot", boom)
    with pytest.raises(RuntimeError, match="plot failed"):
        write_sweep_report(out, make_summary())
    assert "second-sweep" in index.read_text(encoding="utf-8")
    assert (out / "learning_curves.png").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_single_trial_and_edge_cases(tmp_path):
    s = make_summary()
    s["trials"] = [copy.deepcopy(s["trials"][0])]
    s["num_trials"] = 1
    s["trials"][0]["history"][1].pop("val_balanced_accuracy")   # metric missing in one row
    index = write_sweep_report(tmp_path / "one", s)
    dom = _parse(index.read_text(encoding="utf-8"))
    assert len(dom.rows) == 1 and "best" in _classes(dom.rows[0])
    assert "1 configuration tried;" in " ".join(dom.text)
    for png in index.parent.glob("*.png"):
        _assert_not_blank(png)


def test_all_failed_no_test_no_model(tmp_path):
    s = make_summary()
    s["trials"] = [t for t in s["trials"] if t["status"] == "ERROR"] + [copy.deepcopy(s["trials"][2])]
    s["trials"][1]["config"]["train.lr"] = float("nan")
    s["best_trial_id"] = None
    s["best_confusion"] = None
    s["test_metrics"] = None
    s["model_dir"] = None
    index = write_sweep_report(tmp_path / "failed", s)
    markup = index.read_text(encoding="utf-8")
    dom = _parse(markup)
    assert len(dom.rows) == 2 and not any("best" in _classes(r) for r in dom.rows)
    assert "the test split was not used: it stays sealed" in markup
    assert not (index.parent / "confusion_matrix.png").exists()
    assert {img["data-file"] for img in dom.imgs} == {"learning_curves.png", "train_loss.png", "hparams.png"}
    for img in dom.imgs:
        _assert_not_blank(index.parent / img["data-file"])
