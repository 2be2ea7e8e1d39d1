"""Tests of the fake training commands (hog, cuda_oom, hang, crash, liar, torchrun_oom --print-sample) and of
measure.py's out-of-memory signatures against the texts captured in MEASUREMENTS.md. Standard library only.

    python3 -m unittest discover -s tests/support/exec -p 'test_*.py' -v
"""
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "..", "python", "batchfit"))
sys.path.insert(0, HERE)
import measure  # noqa: E402


def run(script, *args, env=None, data_limit=None, timeout=60):
    def limit():
        if data_limit:
            resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFIT_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, os.path.join(HERE, script), *map(str, args)], capture_output=True,
                          text=True, env=full_env, stdin=subprocess.DEVNULL, timeout=timeout, preexec_fn=limit)


def alive(pid):
    """Whether pid is a live process (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Hog(unittest.TestCase):
    def test_capacity_boundary_is_exact(self):
        ok = run("hog.py", "--batch", 24, "--base-mib", 8, "--capacity-mib", 32)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        over = run("hog.py", "--batch", 25, "--base-mib", 8, "--capacity-mib", 32)
        self.assertEqual(over.returncode, 1)
        self.assertRegex(over.stderr.strip().splitlines()[-1], r"^MemoryError: hog: 33 MiB needed, capacity 32 MiB$")
        self.assertEqual(measure.oom_signature(over.stderr), "python-memoryerror")

    def test_rlimit_data_gives_a_natural_memory_error(self):
        limit = 200 << 20
        ok = run("hog.py", "--batch", 64, data_limit=limit)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        over = run("hog.py", "--batch", 400, data_limit=limit)
        self.assertEqual(over.returncode, 1)
        self.assertEqual(over.stderr.strip().splitlines()[-1], "MemoryError")

    def test_batch_from_the_environment_and_report(self):
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "r.json")
            p = run("hog.py", "--report", "--helper", HELPER_DIR,
                    env={"BATCHFIT_BATCH": "3", "BATCHFIT_STEPS": "2", "BATCHFIT_RESULT": result})
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(result) as f:
                r = json.load(f)
            self.assertEqual((r["batch"], r["steps"], len(r["step_seconds"])), (3, 2, 2))

    def test_no_batch_is_a_clear_error(self):
        p = run("hog.py")
        self.assertEqual(p.returncode, 1)
        self.assertIn("no batch size", p.stderr)


class CudaOom(unittest.TestCase):
    def test_threshold(self):
        self.assertEqual(run("cuda_oom.py", "--batch", 32).returncode, 0)
        p = run("cuda_oom.py", env={"BATCHFIT_BATCH": "33"})
        self.assertEqual(p.returncode, 1)
        last = p.stderr.strip().splitlines()[-1]
        self.assertTrue(last.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 0.52 GiB."), last)
        self.assertEqual(measure.oom_signature(p.stderr), "torch-oom")


class Hang(unittest.TestCase):
    def start(self, *args):
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "hang.py"), *args], stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.wait)
        self.addCleanup(lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
        words = proc.stdout.readline().split()  # "hang: pid P grandchild G"
        self.assertEqual(words[:2], ["hang:", "pid"], words)
        return proc, int(words[4])

    def wait_gone(self, pid, seconds=5):
        deadline = time.monotonic() + seconds
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not alive(pid)

    def test_a_group_kill_ends_the_grandchild(self):
        proc, grandchild = self.start()
        self.assertTrue(alive(grandchild))
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(5)
        self.assertTrue(self.wait_gone(grandchild), f"grandchild {grandchild} survived the group kill")

    def test_sigterm_ignored_needs_sigkill(self):
        proc, grandchild = self.start("--ignore-sigterm")
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        self.assertIsNone(proc.poll(), "hang.py --ignore-sigterm ended on SIGTERM")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        self.assertTrue(self.wait_gone(grandchild))

    def test_a_grandchild_in_its_own_session_escapes_a_group_kill(self):
        # documents the limit of process-group kills: batchfit must also walk the tree (or use a cgroup)
        proc, grandchild = self.start("--grandchild-setsid")
        self.addCleanup(lambda: alive(grandchild) and os.kill(grandchild, signal.SIGKILL))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        time.sleep(0.2)
        self.assertTrue(alive(grandchild))


class Crash(unittest.TestCase):
    def test_modes(self):
        p = run("crash.py")
        self.assertEqual(p.returncode, 1)
        self.assertIn("RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x1024 and 512x10)", p.stderr)
        self.assertIsNone(measure.oom_signature(p.stdout + p.stderr))
        self.assertEqual(run("crash.py", "--mode", "segv").returncode, -signal.SIGSEGV)
        self.assertEqual(run("crash.py", "--mode", "abort").returncode, -signal.SIGABRT)
        self.assertEqual(run("crash.py", "--mode", "exit", "--code", 7).returncode, 7)
        p = run("crash.py", "--mode", "recovered-oom")
        self.assertEqual(p.returncode, 0)
        self.assertEqual(measure.oom_signature(p.stderr), "torch-oom")  # the exit status must win


class Liar(unittest.TestCase):
    def lie(self, kind):
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "r.json")
            p = run("liar.py", "--lie", kind, "--helper", HELPER_DIR,
                    env={"BATCHFIT_BATCH": "8", "BATCHFIT_STEPS": "3", "BATCHFIT_ACCUMULATION": "2",
                         "BATCHFIT_RESULT": result, "BATCHFIT_TRIAL": "0"})
            self.assertEqual(p.returncode, 0, p.stderr)
            if not os.path.exists(result):
                return None
            with open(result) as f:
                text = f.read()
            try:
                return json.loads(text)
            except ValueError:
                return text

    def test_lies(self):
        self.assertEqual(self.lie("batch")["batch"], 4)
        self.assertEqual(self.lie("steps")["steps"], 2)
        self.assertEqual(self.lie("accumulation")["accumulation"], 1)
        self.assertIsNone(self.lie("no-report"))
        self.assertIsInstance(self.lie("garbage"), str)
        self.assertEqual(self.lie("schema")["schema"], "batchfit-trial-report/999")


class TorchrunSample(unittest.TestCase):
    def test_captured_sample_and_fake(self):
        with open(os.path.join(HERE, "torchrun_failure_sample.txt")) as f:
            text = f.read()
        root = text.split("Root Cause (first observed failure):", 1)[1]
        self.assertIn("rank      : 1 (local_rank: 1)", root)
        self.assertIn("exitcode  : 1", root)
        self.assertIn("[rank1]: torch.OutOfMemoryError: CUDA out of memory.", text)
        self.assertEqual(measure.oom_signature(text), "torch-oom")
        p = run("torchrun_oom.py", "--print-sample")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stderr, text)


class Signatures(unittest.TestCase):
    """measure.py's list against texts captured under RLIMIT_DATA (MEASUREMENTS.md)."""

    def test_captured_texts(self):
        cases = {
            "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 16777216 bytes. Error code 12 (Cannot allocate memory)": "cpu-allocator",
            "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc": "bad-alloc",
            "  File \"x.py\", line 1\nMemoryError": "python-memoryerror",
            "[rank1]: MemoryError": "python-memoryerror",  # a worker's last line under torchrun
            "ValueError: no MemoryError here": None,
            "ImportError: /venv/torch/_C.cpython-311-x86_64-linux-gnu.so: failed to map segment from shared object":
                "dlopen-map-failed",
            "libgomp: Thread creation failed: Resource temporarily unavailable": "thread-create",
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)": None,
            "SystemError: error return without exception set": None,
        }
        for text, want in cases.items():
            self.assertEqual(measure.oom_signature(text), want, text)


if __name__ == "__main__":
    unittest.main()
