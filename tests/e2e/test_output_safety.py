"""`kiln compile -o DIR` never deletes what it did not write, and an interrupted compile leaves the
previous artifact whole (compiler/artifact.py: check_output, staged_artifact)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from kiln.runtime import Artifact

from test_cli_errors import assert_clean_error, kiln_cli

pytestmark = pytest.mark.e2e


def compile_tiny(tiny_dirs, out, *extra):
    return kiln_cli("compile", str(tiny_dirs["tied"]), "--quant", "q0f32", "-o", str(out), *extra)


def test_directory_with_other_files_is_refused_and_kept(tmp_path, tiny_dirs):
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "notes.txt").write_text("important")
    assert_clean_error(compile_tiny(tiny_dirs, tmp_path / "u"), "not a kiln artifact", str(tmp_path / "u"))
    assert (tmp_path / "u" / "notes.txt").read_text() == "important"


def test_current_directory_is_refused_and_kept(tmp_path, tiny_dirs):
    (tmp_path / "keep.txt").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "compile", str(tiny_dirs["tied"]), "-o", "."],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert_clean_error(proc, "current directory")
    assert (tmp_path / "keep.txt").read_text() == "x"


def test_existing_file_is_refused(tmp_path, tiny_dirs):
    (tmp_path / "f").write_text("data")
    assert_clean_error(compile_tiny(tiny_dirs, tmp_path / "f"), "not a directory")
    assert (tmp_path / "f").read_text() == "data"


def test_options_are_checked_before_the_model_is_read(tmp_path):
    # The model path does not exist: the option errors must come first.
    missing = str(tmp_path / "no-model")
    assert_clean_error(kiln_cli("compile", missing, "--quant", "q3"), "unknown quantization")
    assert_clean_error(kiln_cli("compile", missing, "--target", "tpu"), "tpu")
    assert_clean_error(kiln_cli("compile", missing, "--context-window", "0"), "--context-window must be at least 1")


def _interruptible() -> None:
    """In the child, before exec: SIGINT unblocked and at its default, as a terminal's Ctrl-C finds a
    shell's child. A suite started in the background by a non-interactive shell (`cmd &`, as CI
    scripts and nohup do) runs with SIGINT ignored (POSIX: such a job starts with it at SIG_IGN,
    and Python then keeps it so), and every child inherits that."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sigint_state() -> str:
    """What a child of this process starts with, for a failure's message: its blocked and ignored signals."""
    status = subprocess.run([sys.executable, "-c", "print(open('/proc/self/status').read())"],
                            capture_output=True, text=True).stdout
    return f"{signal.getsignal(signal.SIGINT)}; child " + " ".join(
        line.replace("\t", " ") for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn")))


def test_context_window_beyond_the_model_is_refused(tmp_path, tiny_dirs):
    assert_clean_error(kiln_cli("compile", str(tiny_dirs["tied"]), "--context-window", "100000", "-o",
                                str(tmp_path / "a")), "exceeds the model's context window", "256")
    assert not (tmp_path / "a").exists()


def test_an_artifact_is_replaced_only_with_force(tmp_path, tiny_dirs, tiny_artifacts):
    out = shutil.copytree(tiny_artifacts["tied"], tmp_path / "art")
    first = (out / "kiln-config.json").read_text()
    assert json.loads(first)["model"]["source"]["path"] == "tied"     # a name, never the machine's full path
    assert_clean_error(compile_tiny(tiny_dirs, out), "already holds a kiln artifact", "--force")
    assert (out / "kiln-config.json").read_text() == first


@pytest.mark.alone
def test_interrupts_keep_the_artifact_a_forced_compile_replaces(tmp_path, tiny_dirs, tiny_artifacts):
    out = shutil.copytree(tiny_artifacts["tied"], tmp_path / "art")     # what `kiln compile` wrote: a copy
    first = (out / "kiln-config.json").read_text()
    for sig in (signal.SIGINT, signal.SIGKILL):
        # An interrupt that lands after the swap, or after the compile has exited (a loaded host: the
        # test's own wakeups come late), leaves the new artifact: whole, and the test tries again.
        for _ in range(5):
            proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "compile", str(tiny_dirs["tied"]), "--quant",
                                     "q0f32", "-o", str(out), "--force"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, preexec_fn=_interruptible)
            deadline = time.time() + 120
            while not list(tmp_path.glob(".art.partial-*")) and time.time() < deadline and proc.poll() is None:
                time.sleep(0.05)                  # the staging directory exists: the write is under way
            os.kill(proc.pid, sig)
            proc.wait(timeout=60)
            now = (out / "kiln-config.json").read_text()
            if now == first:
                assert proc.returncode != 0, f"{sig!r} left the old artifact but the compile exited 0"
                break
            Artifact.load(out)                    # replaced whole (its hashes check), never half-written
            first = now
        else:
            pytest.fail(f"{sig!r} never landed before the compile had swapped its artifact in ({_sigint_state()})")
    proc = compile_tiny(tiny_dirs, out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.glob(".art.*")), "the killed compile's staging directory was not cleaned up"
    assert (out / "kiln-config.json").is_file()


@pytest.mark.alone
def test_an_interrupt_while_tvm_builds_exits_130_leaving_nothing(tmp_path, tiny_dirs):
    """Ctrl-C while the library builds on its thread (inside TVM's C++): `interrupted`, exit 130 and
    no output, not an abort at the interpreter's shutdown ("terminate called without an active
    exception", seen before kiln/cli_info.py exit_interrupted)."""
    for attempt in range(3):             # a loaded host may deliver the interrupt after the build: again
        out, ir = tmp_path / f"art{attempt}", tmp_path / f"ir{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "compile", str(tiny_dirs["tied"]), "--quant",
                                 "q4f32", "-o", str(out), "--no-golden", "--dump-ir", str(ir)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_interruptible)
        deadline = time.time() + 120
        while not (ir / "0-graph.py").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)             # the build thread has finished its first phase: TVM is lowering
        os.kill(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
        if not (ir / "4-finalize.py").exists():
            break
        shutil.rmtree(out, ignore_errors=True)
    else:
        pytest.fail(f"the compile had finished building before each of 3 interrupts ({_sigint_state()})")
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert b"interrupted" in err and b"terminate called" not in err
    assert not out.exists() and not list(tmp_path.glob(".art.*"))


def test_weights_the_config_does_not_match_are_one_line_and_leave_nothing(tmp_path, tiny_dirs):
    """A checkpoint whose tensors disagree with its config.json fails while its weights convert, beside the library
    building on its thread: one line naming the mismatch, exit 1, no artifact, and no abort at the interpreter's
    shutdown (kiln/cli_info.py _exit; it was "terminate called without an active exception", exit 134)."""
    src = tmp_path / "src"
    shutil.copytree(tiny_dirs["tied"], src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(config, intermediate_size=config["intermediate_size"] * 2)))
    out = tmp_path / "art"
    proc = kiln_cli("compile", str(src), "--quant", "q4f32", "-o", str(out))
    assert_clean_error(proc, "config.json does not match the weights")
    assert proc.returncode == 1 and "terminate called" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert not out.exists() and not list(tmp_path.glob(".art.*"))


def test_bad_option_values_are_one_line(tmp_path):
    assert_clean_error(kiln_cli("serve", str(tmp_path), "--port", "99999"), "--port", "65535")
    assert_clean_error(kiln_cli("bench", str(tmp_path), "--batch", "0"), "--batch", "x>=1")


def test_an_android_artifact_on_this_machine_is_one_line(tmp_path, tiny_dirs):
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("checks an AArch64 artifact on an x86 host")
    out = tmp_path / "android"
    proc = kiln_cli("compile", str(tiny_dirs["tied"]), "--quant", "q0f32", "--target", "android", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert_clean_error(kiln_cli("generate", str(out), "hello"), "for android", "aarch64", "--target cpu")


def test_a_folder_without_tokenizer_compiles_with_a_note(tmp_path, tiny_dirs):
    import shutil
    src = tmp_path / "src"
    shutil.copytree(tiny_dirs["tied"], src)
    (src / "tokenizer.json").unlink()
    proc = compile_tiny({"tied": src}, tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    assert "note: no tokenizer.json: the artifact takes token ids only" in proc.stderr


def test_a_failing_library_build_stops_the_compile_and_leaves_nothing(tmp_path, tiny_dirs, monkeypatch):
    """The library builds on a thread beside the weight conversion (compiler/build.py): its error is
    the compile's error, raised on the caller's thread, and the staged artifact is removed."""
    import kiln
    from kiln.compiler import build

    def fail(*_args, **_kwargs):
        raise RuntimeError("the TVM build failed here")

    monkeypatch.setattr(build, "build_lib", fail)
    with pytest.raises(RuntimeError, match="the TVM build failed here"):
        kiln.compile(str(tiny_dirs["tied"]), quant="q0f32", output=tmp_path / "a", golden=False)
    assert list(tmp_path.iterdir()) == []


def test_an_artifact_replaced_in_place_runs_its_own_library_in_the_same_process(tmp_path, tiny_artifacts):
    """A process that ran an artifact and then runs the one a forced recompile put at the same path runs the new
    library: the dynamic loader hands out the library it loaded for a path again, even after the file was replaced
    (here the untied model's 15 weights went to the tied one's 14-weight functions: a TVM crash, or with equal
    shapes silently the old model's kernels). runtime/_tvm.py load_library."""
    import numpy as np
    from kiln.runtime.model_runner import ModelRunner

    def logits(art):
        runner = ModelRunner(Artifact.load(art))
        runner.add_sequence(0)
        return runner.verify(0, [1, 5, 9, 2])

    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts["tied"], art)
    np.testing.assert_array_equal(logits(art), logits(tiny_artifacts["tied"]))
    for kind in ("untied", "tied"):                     # replaced, then replaced back with another file again
        shutil.rmtree(art)
        shutil.copytree(tiny_artifacts[kind], art)
        np.testing.assert_array_equal(logits(art), logits(tiny_artifacts[kind]))
