"""Issue 12, output and terminal safety: names from hostile shards are escaped and cut when printed,
URL passwords are never written down, the float image encoder refuses out-of-range values, .pkl decodes.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shardflow.codecs import Decoder, decode_value, encode_value
from shardflow.errors import DecodeError, EncodeError
from shardflow.shards.samples import read_samples
from shardflow.text import escape, redact_userinfo, safe, safe_repr, truncate
from tests.support.http_server import serve_directory
from tests.support.jobs import cli, errors_logged, make_shards, write_job

EVIL_KEY = "a\x1b]0;pwned\x07\x1b[2Jb\nforged line\u202e"  # retitle, clear screen, a new line, bidi override


def write_tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def assert_terminal_safe(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "forged line" not in "\n".join(line for line in text.splitlines() if line.startswith("forged line"))


# -- the helper -------------------------------------------------------------------------------------


def test_escape_and_truncate():
    assert escape("plain/key_01 é ü") == "plain/key_01 é ü"
    assert escape(EVIL_KEY) == "a\\x1b]0;pwned\\x07\\x1b[2Jb\\nforged line\\u202e"
    assert escape("bad\udcff") == "bad\\udcff"  # a lone surrogate (non-UTF-8 byte) would make print() raise
    long = "x" * 5_000_000
    cut = truncate(long)
    assert len(cut) < 400 and "more characters" in cut
    assert len(safe(long)) < 400
    assert safe_repr("a\nb") == "'a\\nb'"
    assert redact_userinfo("see http://user:pw@host/x.tar and s3://b/k") == "see http://***@host/x.tar and s3://b/k"


# -- ls / stats / status ----------------------------------------------------------------------------


def test_ls_escapes_member_names(tmp_path):
    shard = write_tar(tmp_path / "evil.tar", [(EVIL_KEY + ".txt", b"hi"), ("ok.txt", b"ok"),
                                              ("x.ev\x1b[31mil", b"1")])
    done = cli("ls", shard)
    assert done.returncode == 0, done.stderr
    assert_terminal_safe(done.stdout)
    assert len(done.stdout.splitlines()) == 3  # one line per sample: no forged line
    assert "a\\x1b]0;pwned\\x07\\x1b[2Jb\\nforged line\\u202e\ttxt:2" in done.stdout
    as_json = cli("ls", "--json", shard)
    keys = [json.loads(line)["key"] for line in as_json.stdout.splitlines()]
    assert keys[0] == EVIL_KEY  # JSON keeps the exact key (JSON escapes it)
    stats = cli("stats", shard)
    assert stats.returncode == 0, stats.stderr
    assert_terminal_safe(stats.stdout)
    assert "ev\\x1b[31mil" in stats.stdout


def test_errors_name_a_huge_long_name_in_a_bounded_line(tmp_path):
    huge = "n" * 5_000_000  # a GNU long name without an extension: reported, named in the message
    shard = write_tar(tmp_path / "long.tar", [("k.txt", b"1"), (huge, b"x"), ("k2.txt", b"2")])
    done = cli("ls", "--on-error", "raise", shard)
    assert done.returncode == 1
    assert len(done.stderr) < 5000, len(done.stderr)
    assert "more characters" in done.stderr


def test_status_escapes_keys_and_cuts_errors_files(tmp_path):
    huge = "h" * 2_000_000
    shard = write_tar(tmp_path / "in" / "evil.tar", [
        (EVIL_KEY + ".jpg", b"not an image"), (huge + ".jpg", b"not an image either"), ("fine.jpg", b"nope")])
    job = write_job(tmp_path, """
        def process(sample):
            return sample
    """)
    out = tmp_path / "out"
    done = cli("run", job, "--inputs", shard, "--outputs", str(out / "{name}.tar"), "--set", "decode=rgb8",
               "--set", "max_failure_rate=1.0", "-b", "serial")
    assert done.returncode == 0, done.stderr
    assert_terminal_safe(done.stdout + done.stderr)
    logged = errors_logged(out / "_shardflow")
    assert {e["key"] for e in logged} >= {EVIL_KEY}
    assert all(len(json.dumps(e)) < 5000 for e in logged)  # the 2 MB key is cut in errors/
    status = cli("status", out / "_shardflow")
    assert status.returncode == 0, status.stderr
    assert_terminal_safe(status.stdout)
    assert "a\\x1b]0;pwned" in status.stdout
    assert max(len(line) for line in status.stdout.splitlines()) < 5000


def test_one_line_error_for_a_hostile_url(tmp_path):
    done = cli("ls", str(tmp_path / "no\x1b]0;x\x07such.tar"))
    assert done.returncode == 1
    assert_terminal_safe(done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1


# -- codecs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale, words", [
    (255.0, "got values in [0, 255] (scale 0..255 images by 1/255)"),  # forgot the /255
    (None, "got values in [-1, 1] (map [-1, 1] by (x + 1) / 2)"),  # a [-1, 1] tensor
])
def test_float_images_out_of_range_are_refused(scale, words):
    ramp = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    value = ramp * scale if scale else ramp * 2 - 1
    with pytest.raises(EncodeError, match=re.escape(words)) as info:
        encode_value("png", np.dstack([value] * 3), key="k1")
    assert info.value.key == "k1"
    edge = np.dstack([ramp] * 3)
    edge[0, 0] = [1.001, -0.001, 0.5]  # rounding noise at the bounds is fine
    assert decode_value("png", encode_value("png", edge), "rgb8")[0, 0].tolist() == [255, 0, 128]


@pytest.mark.slow
def test_float_tensor_out_of_range_in_a_job_is_one_sample_error(tmp_path):
    make_shards(tmp_path / "in", 1, 3)
    job = write_job(tmp_path, """
        def process(sample):
            image = sample["jpg"]
            if sample["__key__"] == "s000001":
                image = image * 255  # forgot that rgb decodes to [0, 1]
            return {"__key__": sample["__key__"], "png": image}
    """)
    out = tmp_path / "out"
    done = cli("run", job, "--inputs", str(tmp_path / "in" / "in-000000.tar"), "--outputs", str(out / "{name}.tar"),
               "--set", "decode=torchrgb", "--set", "max_failure_rate=1.0", "-b", "serial")
    assert done.returncode == 0, done.stderr
    logged = errors_logged(out / "_shardflow")
    assert [(e["key"], e["type"]) for e in logged] == [("s000001", "EncodeError")]
    assert "float pixels must be in [0, 1]" in logged[0]["reason"]
    assert [s["__key__"] for s in read_samples(str(out / "in-000000.tar"))] == ["s000000", "s000002"]


def test_pkl_decodes_when_pickle_is_allowed():
    data = pickle.dumps({"a": [1, 2]})
    assert decode_value("pkl", data, allow_pickle=True) == {"a": [1, 2]}
    with pytest.raises(DecodeError, match="allow_pickle"):
        decode_value("pkl", data)
    assert Decoder(allow_pickle=True)({"__key__": "k", "x.pkl": data})["x.pkl"] == {"a": [1, 2]}


# -- URL passwords are never written down -----------------------------------------------------------


@pytest.mark.slow
def test_url_passwords_stay_out_of_the_run_directory(tmp_path):
    make_shards(tmp_path / "in", 2, 3, bad={"s000001"})
    (tmp_path / "in" / "in-000002.tar").write_bytes(b"garbage" * 200)  # a task that fails
    job = write_job(tmp_path, """
        def process(sample):
            return {"__key__": sample["__key__"], "jpg": sample["jpg"]}
    """)
    out = tmp_path / "out"
    with serve_directory(tmp_path / "in", auth="alice:s3cretpw") as base:
        inputs = base.replace("http://", "http://alice:s3cretpw@") + "/in-{000000..000002}.tar"
        done = cli("run", job, "--inputs", inputs, "--outputs", str(out / "{name}.tar"), "--set", "decode=rgb8",
                   "--set", "max_failure_rate=1.0", "-b", "serial", "--json")
        plan = cli("plan", job, "--inputs", inputs, "--outputs", str(out / "{name}.tar"))
    assert done.returncode == 1, done.stderr  # task 2 failed, the others are done (the password worked)
    report = json.loads(done.stdout)
    assert report["done"] == 2 and set(report["failed"]) == {"2"}
    status = cli("status", out / "_shardflow", "--json")
    written = {p.name: p.read_bytes() for p in (out / "_shardflow").rglob("*") if p.is_file()}
    assert {"plan.json", "job.pkl", "000000.json", "000002.json", "000000.jsonl", "summary.json"} <= set(written)
    for name, data in written.items():
        assert b"s3cretpw" not in data, name
    for text in (done.stdout, done.stderr, plan.stdout, plan.stderr, status.stdout):
        assert "s3cretpw" not in text
    assert "http://***@127.0.0.1" in (out / "_shardflow" / "plan.json").read_text()
    # a pod reading the plan cannot reopen the URL; it says why instead of sending '***'
    worker = cli("worker", "--run-dir", out / "_shardflow", "--index", "2")
    assert "password of this URL was left out" in worker.stdout + worker.stderr
