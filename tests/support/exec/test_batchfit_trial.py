"""Unit tests of python/batchfit/batchfit_trial.py (the helper `batchfit python-helper` prints).

Standard library only; torch and Lightning are used when present (those tests say so when skipped).

    python3 -m unittest discover -s tests/support/exec -p 'test_*.py' -v
    # or, with torch: ~/.cache/batchfit/libtorch-2.11.0/bin/python -m unittest discover -s tests/support/exec -v
"""
import importlib
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "..", "python", "batchfit"))
sys.path.insert(0, HELPER_DIR)
import batchfit_trial as bt  # noqa: E402

REPORT_KEYS = {"schema", "batch", "steps", "accumulation", "reads_accumulation", "reads_batch", "step_seconds",
               "rank", "world_size", "cuda", "python", "torch", "read_files", "modules",
               "python_environment"}


class HelperCase(unittest.TestCase):
    """Each test starts with no BATCHFIT_* (or RANK/WORLD_SIZE) variables and a fresh helper state."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.result = os.path.join(self.tmp.name, "result.json")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("BATCHFIT_") and k not in ("RANK", "WORLD_SIZE")}
        patcher = mock.patch.dict(os.environ, env, clear=True)
        patcher.start()
        self.addCleanup(patcher.stop)
        bt._reset_for_tests()

    def trial_env(self, batch=16, steps=3, accumulation=2, trial=4, **more):
        os.environ.update(BATCHFIT_BATCH=str(batch), BATCHFIT_STEPS=str(steps),
                          BATCHFIT_ACCUMULATION=str(accumulation), BATCHFIT_TRIAL=str(trial),
                          BATCHFIT_RESULT=self.result, **{k: str(v) for k, v in more.items()})

    def read(self, path=None):
        with open(path or self.result) as f:
            return json.load(f)


class OutsideBatchfit(HelperCase):
    def test_defaults_are_returned(self):
        self.assertEqual(bt.batch_size(default=64), 64)
        self.assertEqual(bt.steps(default=100), 100)
        self.assertEqual(bt.accumulation(), 1)
        self.assertEqual(bt.accumulation(default=4), 4)
        self.assertIsNone(bt.trial_index())
        self.assertFalse(bt.in_trial())

    def test_missing_value_without_default_is_a_clear_error(self):
        with self.assertRaisesRegex(bt.BatchfitError, r"BATCHFIT_BATCH is not set.*batch_size\(default=\.\.\.\)"):
            bt.batch_size()
        with self.assertRaisesRegex(bt.BatchfitError, "BATCHFIT_STEPS"):
            bt.steps()

    def test_bad_defaults_are_refused(self):
        for bad in (0, -1, "8", 2.5, True):
            with self.assertRaises(bt.BatchfitError, msg=repr(bad)):
                bt.batch_size(default=bad)

    def test_report_and_trial_write_nothing(self):
        bt.batch_size(default=8)
        self.assertIsNone(bt.report(steps=1))
        with bt.Trial(batch=8) as t:
            t.step()
        self.assertEqual(os.listdir(self.tmp.name), [])

    def test_report_without_batch_or_steps_is_silent_outside_batchfit(self):
        # the user's own run must never fail because of the helper
        self.assertIsNone(bt.report())


class InsideBatchfit(HelperCase):
    def test_environment_values(self):
        self.trial_env(batch=16, steps=5, accumulation=2, trial=7)
        self.assertEqual(bt.batch_size(default=64), 16)
        self.assertEqual(bt.steps(default=100), 5)
        self.assertEqual(bt.accumulation(), 2)
        self.assertEqual(bt.trial_index(), 7)
        self.assertTrue(bt.in_trial())

    def test_malformed_environment_is_an_error(self):
        for raw in ("abc", "0", "-3", "1.5"):
            os.environ["BATCHFIT_BATCH"] = raw
            with self.assertRaisesRegex(bt.BatchfitError, "BATCHFIT_BATCH", msg=raw):
                bt.batch_size(default=1)

    def test_read_files_are_the_jobs_own_modules_and_the_files_it_read_under_the_working_directory(self):
        import importlib
        self.trial_env()
        os.makedirs(os.path.join(self.tmp.name, "src"))
        with open(os.path.join(self.tmp.name, "src", "local_model_for_test.py"), "w") as f:
            f.write("WIDTH = 3\n")
        sys.path.insert(0, os.path.join(self.tmp.name, "src"))
        self.addCleanup(sys.path.remove, os.path.join(self.tmp.name, "src"))
        self.addCleanup(sys.modules.pop, "local_model_for_test", None)
        importlib.import_module("local_model_for_test")
        cwd = os.getcwd()
        os.chdir(self.tmp.name)
        self.addCleanup(os.chdir, cwd)
        with open("cfg.toml", "w") as f:
            f.write("x = 1\n")
        del bt._opened[:]
        bt._record_open("open", ("cfg.toml", "r", 0))
        bt._record_open("open", ("out.log", "w", 0))  # written, not read
        bt._record_open("open", (3, "r", 0))  # a descriptor, not a path
        files = bt.report(batch=16, steps=3) and self.read()["read_files"]
        real = os.path.realpath(self.tmp.name)
        names = [os.path.relpath(os.path.realpath(f), real) for f in files]
        self.assertIn(os.path.join("src", "local_model_for_test.py"), names)
        self.assertIn("cfg.toml", names)
        self.assertNotIn("out.log", names)
        self.assertFalse(any(f.endswith(os.sep + "json" + os.sep + "__init__.py") for f in files), files)

    def test_files_opened_outside_the_working_directory_are_read_files_but_the_installations_are_not(self):
        self.trial_env()
        conf = os.path.join(self.tmp.name, "conf")
        work = os.path.join(self.tmp.name, "work")
        lib = os.path.join(self.tmp.name, "prefix", "lib")
        for d in (conf, work, lib):
            os.makedirs(d)
        for f in (os.path.join(conf, "model.cfg"), os.path.join(lib, "installed.txt")):
            with open(f, "w") as fh:
                fh.write("x\n")
        cwd = os.getcwd()
        os.chdir(work)
        self.addCleanup(os.chdir, cwd)
        del bt._opened[:]
        with mock.patch.object(bt, "_not_the_jobs", (os.path.join(self.tmp.name, "prefix") + os.sep,)):
            bt._record_open("open", ("../conf/model.cfg", "r", 0))
            bt._record_open("open", (os.path.join(lib, "installed.txt"), "r", 0))
        files = bt.report(batch=16, steps=3) and self.read()["read_files"]
        self.assertIn(os.path.join(conf, "model.cfg"), files)
        self.assertNotIn(os.path.join(lib, "installed.txt"), files)

    def test_installed_packages_are_recorded_by_their_distributions_and_their_files_stat(self):
        self.trial_env()
        site = os.path.join(self.tmp.name, "venv", "site-packages")
        os.makedirs(os.path.join(site, "pkg_for_env_test"))
        os.makedirs(os.path.join(site, "pkg_for_env_test-1.0.dist-info"))
        init = os.path.join(site, "pkg_for_env_test", "__init__.py")
        with open(init, "w") as f:
            f.write("WIDTH = 3\n")
        sys.path.insert(0, site)
        self.addCleanup(sys.path.remove, site)
        self.addCleanup(sys.modules.pop, "pkg_for_env_test", None)
        importlib.import_module("pkg_for_env_test")
        r = bt.report(batch=16, steps=3) and self.read()
        env = r["python_environment"]
        self.assertIn(site, env["site_dirs"])
        self.assertIn(os.path.join(site, "pkg_for_env_test-1.0.dist-info"), env["distributions"])
        st = os.stat(init)
        self.assertIn({"path": init, "size": st.st_size, "mtime_ns": st.st_mtime_ns}, env["files"])
        self.assertNotIn(init, r["read_files"])

    def test_a_failure_finding_the_read_files_leaves_the_report_whole(self):
        self.trial_env()
        with mock.patch.object(bt.sysconfig, "get_paths", side_effect=RuntimeError("broken")):
            bt.report(batch=16, steps=3)
        self.assertEqual(self.read()["batch"], 16)
        bt._record_open("open", None)  # a malformed event never raises

    def test_report_has_exactly_the_schema(self):
        self.trial_env(batch=16, steps=3, accumulation=2)
        batch, accum = bt.batch_size(), bt.accumulation()
        path = bt.report(batch=batch, steps=3, accumulation=accum, step_seconds=[0.5, 0.25, 0.25])
        self.assertEqual(path, self.result)
        r = self.read()
        self.assertEqual(set(r), REPORT_KEYS)
        self.assertEqual(r["schema"], "batchfit-trial-report/1")
        self.assertEqual((r["batch"], r["steps"], r["accumulation"]), (16, 3, 2))
        self.assertIs(r["reads_accumulation"], True)
        self.assertEqual(r["step_seconds"], [0.5, 0.25, 0.25])
        self.assertEqual((r["rank"], r["world_size"]), (0, 1))
        self.assertEqual(r["python"].count("."), 2)
        for key in ("batch", "steps", "accumulation", "rank", "world_size"):
            self.assertIs(type(r[key]), int, key)

    def test_reads_batch_samples_and_nan(self):
        # the size came from BATCHFIT_BATCH and the report says it: proof the job read it
        self.trial_env(batch=12)
        bt.batch_size()
        with bt.Trial() as t:
            t.step(samples=12)
            t.step(samples=7)
        r = self.read()
        self.assertIs(r["reads_batch"], True)
        self.assertEqual(r["samples"], 12)
        # a default (no BATCHFIT_BATCH) proves nothing
        bt._reset_for_tests()
        os.environ.pop("BATCHFIT_BATCH")
        bt.batch_size(default=5)
        bt.report(steps=1)
        r = self.read()
        self.assertIs(r["reads_batch"], False)
        self.assertNotIn("samples", r)
        # NaN is refused, not written as a non-JSON token
        with self.assertRaises(bt.BatchfitError):
            bt.report(batch=5, steps=1, step_seconds=[float("nan")])

    def test_defaults_come_from_what_the_script_read(self):
        self.trial_env(batch=12, steps=4, accumulation=3)
        bt.batch_size(), bt.steps(), bt.accumulation()
        bt.report()
        r = self.read()
        self.assertEqual((r["batch"], r["steps"], r["accumulation"]), (12, 4, 3))
        self.assertEqual(r["step_seconds"], [])

    def test_accumulation_not_read_is_reported_as_such(self):
        self.trial_env(accumulation=4)
        bt.report(batch=8, steps=1)
        r = self.read()
        self.assertIs(r["reads_accumulation"], False)
        self.assertEqual(r["accumulation"], 1)

    def test_unknown_batch_or_steps_is_an_error_under_batchfit(self):
        self.trial_env()
        with self.assertRaisesRegex(bt.BatchfitError, "batch size trained is unknown"):
            bt.report(steps=1)
        with self.assertRaisesRegex(bt.BatchfitError, "number of optimizer steps is unknown"):
            bt.report(batch=4)
        self.assertFalse(os.path.exists(self.result))

    def test_extra_keywords_go_to_extra_only_when_given(self):
        self.trial_env()
        bt.report(batch=4, steps=1, model="mlp", params=123)
        self.assertEqual(self.read()["extra"], {"model": "mlp", "params": 123})

    def test_other_ranks_write_their_own_file(self):
        self.trial_env(RANK=1, WORLD_SIZE=2)
        path = bt.report(batch=4, steps=2)
        self.assertEqual(path, self.result + ".rank1")
        self.assertFalse(os.path.exists(self.result))
        r = self.read(path)
        self.assertEqual((r["rank"], r["world_size"]), (1, 2))

    def test_write_is_atomic_and_leaves_no_temporary_file(self):
        self.trial_env()
        with open(self.result, "w") as f:
            f.write("old")
        real_replace = os.replace
        seen = []

        def spy(src, dst):
            seen.append((os.path.dirname(src), os.path.exists(dst)))
            return real_replace(src, dst)

        with mock.patch.object(bt.os, "replace", spy):
            bt.report(batch=4, steps=1)
        self.assertEqual(seen, [(self.tmp.name, True)])  # a temporary in the same directory, then a rename
        self.assertEqual(os.listdir(self.tmp.name), ["result.json"])
        self.assertEqual(self.read()["batch"], 4)

    def test_failed_write_leaves_no_temporary_file(self):
        self.trial_env()
        with mock.patch.object(bt.os, "replace", side_effect=OSError("disk full")):
            with self.assertRaises(OSError):
                bt.report(batch=4, steps=1)
        self.assertEqual(os.listdir(self.tmp.name), [])


class TrialBlock(HelperCase):
    def test_steps_are_timed_and_reported_on_exit(self):
        self.trial_env(batch=16, accumulation=2)
        with bt.Trial(batch=bt.batch_size(), accumulation=bt.accumulation()) as t:
            for _ in range(3):
                t.step()
            t.extra["note"] = "ok"
        r = self.read()
        self.assertEqual((r["batch"], r["steps"], r["accumulation"]), (16, 3, 2))
        self.assertEqual(len(r["step_seconds"]), 3)
        self.assertTrue(all(s >= 0 for s in r["step_seconds"]))
        self.assertEqual(r["extra"], {"note": "ok"})

    def test_exception_means_no_report_and_is_not_swallowed(self):
        self.trial_env()
        with self.assertRaises(MemoryError):
            with bt.Trial(batch=4) as t:
                t.step()
                raise MemoryError()
        self.assertFalse(os.path.exists(self.result))

    def test_sys_exit_zero_reports_and_nonzero_does_not(self):
        self.trial_env()
        with self.assertRaises(SystemExit):
            with bt.Trial(batch=4) as t:
                t.step()
                sys.exit(0)
        self.assertEqual(self.read()["steps"], 1)
        os.remove(self.result)
        with self.assertRaises(SystemExit):
            with bt.Trial(batch=4):
                sys.exit(3)
        self.assertFalse(os.path.exists(self.result))

    def test_the_report_is_written_when_the_last_step_asked_for_ends(self):
        self.trial_env(batch=16, steps=3, accumulation=2)
        with bt.Trial(batch=bt.batch_size(), accumulation=bt.accumulation()) as t:
            t.step()
            t.step()
            self.assertFalse(os.path.exists(self.result))
            t.step()
            r = self.read()  # before the block ends: a trial ended now keeps its evidence
            self.assertEqual((r["batch"], r["steps"], r["accumulation"]), (16, 3, 2))
            os.remove(self.result)
        self.assertEqual(self.read()["steps"], 3)

    def test_a_step_without_a_trial_block_writes_no_report(self):
        self.trial_env(steps=1)
        bt.batch_size()
        bt.step()
        self.assertFalse(os.path.exists(self.result))

    def test_the_report_names_the_installed_modules_imported_submodules_included_in_import_order(self):
        self.trial_env()
        site = os.path.join(self.tmp.name, "site-packages", "fakepkg")
        fake = types.ModuleType("fakepkg")
        fake.__file__ = os.path.join(site, "__init__.py")
        sub = types.ModuleType("fakepkg.sub")
        sub.__file__ = os.path.join(site, "sub.py")
        lazy = types.ModuleType("fakepkg._lazy")  # imported late, as an optimizer's first step does
        lazy.__file__ = os.path.join(site, "_lazy.py")
        own = types.ModuleType("ownmod")
        own.__file__ = os.path.join(self.tmp.name, "ownmod.py")
        with mock.patch.dict(sys.modules, {"fakepkg": fake, "fakepkg.sub": sub, "ownmod": own}):
            sys.modules["fakepkg._lazy"] = lazy
            bt.report(batch=4, steps=1)
        modules = self.read()["modules"]
        self.assertEqual([m for m in modules if m.startswith("fakepkg")],
                         ["fakepkg", "fakepkg.sub", "fakepkg._lazy"])
        self.assertNotIn("ownmod", modules)
        self.assertNotIn("json", modules)  # the standard library is not installed packages

    def test_files_read_only_in_dataloader_like_workers_are_read_files(self):
        # workers forked and spawned by the job (as DataLoader workers are) read a data file and
        # import a module of the job that the reporting process never touches
        work = os.path.join(self.tmp.name, "work")
        os.makedirs(work)
        with open(os.path.join(work, "worker_only_mod.py"), "w") as f:
            f.write("VALUE = 1\n")
        for name in ("shard-fork.txt", "shard-spawn.txt"):
            with open(os.path.join(work, name), "w") as f:
                f.write("data\n")
        script = os.path.join(work, "job.py")
        with open(script, "w") as f:
            f.write(
                "import multiprocessing as mp, sys\n"
                f"sys.path.insert(0, {HELPER_DIR!r})\n"
                "import batchfit_trial as bt\n"
                "def load(name):\n"
                "    import worker_only_mod\n"
                "    open(name).read()\n"
                "if __name__ == '__main__':\n"
                "    for method in ('fork', 'spawn'):\n"
                "        p = mp.get_context(method).Process(target=load, args=(f'shard-{method}.txt',))\n"
                "        p.start(); p.join()\n"
                "    bt.report(batch=4, steps=1)\n")
        env = dict(os.environ, BATCHFIT_BATCH="4", BATCHFIT_STEPS="1", BATCHFIT_RESULT=self.result)
        subprocess.run([sys.executable, script], cwd=work, env=env, check=True, timeout=120)
        names = {os.path.basename(f) for f in self.read()["read_files"]}
        self.assertTrue({"shard-fork.txt", "shard-spawn.txt", "worker_only_mod.py"} <= names, names)

    def test_step_times_are_wall_times(self):
        self.trial_env()
        import time
        with bt.Trial(batch=4) as t:
            time.sleep(0.05)
            t.step()
        self.assertGreaterEqual(self.read()["step_seconds"][0], 0.045)


class WithoutTorch(unittest.TestCase):
    """The helper must import and work with the standard library alone, and never import torch."""

    def run_python(self, code, env=None):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFIT_")}
        full_env.update(env or {})
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                              cwd=HELPER_DIR, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout

    def test_works_when_torch_cannot_be_imported(self):
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "r.json")
            out = self.run_python(
                "import sys; sys.modules['torch'] = None\n"  # `import torch` now raises ImportError
                "import batchfit_trial as bt\n"
                "with bt.Trial(batch=bt.batch_size(), accumulation=bt.accumulation()) as t:\n"
                "    t.step()\n"
                "print('ok')\n",
                {"BATCHFIT_BATCH": "3", "BATCHFIT_RESULT": result, "BATCHFIT_TRIAL": "0"})
            self.assertEqual(out.strip(), "ok")
            with open(result) as f:
                r = json.load(f)
            self.assertIsNone(r["torch"])
            self.assertIsNone(r["cuda"])

    def test_never_imports_torch_or_frameworks_itself(self):
        out = self.run_python(
            "import sys, batchfit_trial as bt\n"
            "bt.report(batch=1, steps=1)\n"
            "print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))\n")
        self.assertEqual(out.strip(), "[]")

    def test_framework_callbacks_need_their_framework(self):
        out = self.run_python(
            "import sys\n"
            "for m in ('lightning', 'lightning.pytorch', 'lightning.pytorch.callbacks', 'pytorch_lightning',\n"
            "          'pytorch_lightning.callbacks', 'transformers'):\n"
            "    sys.modules[m] = None\n"
            "import batchfit_trial as bt\n"
            "for name in ('BatchfitCallback', 'BatchfitTrainerCallback'):\n"
            "    try:\n"
            "        exec(f'from batchfit_trial import {name}')\n"
            "    except ImportError as e:\n"
            "        print(e)\n")
        self.assertIn("BatchfitCallback needs Lightning", out)
        self.assertIn("BatchfitTrainerCallback needs the transformers package", out)


class FakeFrameworks(HelperCase):
    """The callbacks against stand-in framework modules (the real ones are tested when installed)."""

    def install(self, modules):
        saved = {name: sys.modules.get(name) for name in modules}
        sys.modules.update(modules)

        def restore():
            for name, mod in saved.items():
                if mod is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = mod
            for name in ("BatchfitCallback", "BatchfitTrainerCallback"):
                bt.__dict__.pop(name, None)  # built lazily against the fakes: forget them
        self.addCleanup(restore)

    def test_lightning_callback_counts_optimizer_steps_not_batches(self):
        callbacks = types.ModuleType("lightning.pytorch.callbacks")
        callbacks.Callback = type("Callback", (), {})
        self.install({"lightning": types.ModuleType("lightning"),
                      "lightning.pytorch": types.ModuleType("lightning.pytorch"),
                      "lightning.pytorch.callbacks": callbacks})
        bt.__dict__.pop("BatchfitCallback", None)
        self.trial_env(batch=5, accumulation=2, RANK=0)
        cb = bt.BatchfitCallback()
        trainer = types.SimpleNamespace(global_step=0, accumulate_grad_batches=2, global_rank=0, world_size=1)
        batch = (types.SimpleNamespace(shape=(5, 8)), types.SimpleNamespace(shape=(5,)))
        cb.on_train_start(trainer, None)
        for i in range(6):  # 6 micro-batches, accumulation 2: 3 optimizer steps
            if i % 2 == 1:
                trainer.global_step += 1
            cb.on_train_batch_end(trainer, None, None, batch, i)
        cb.on_train_end(trainer, None)
        r = self.read()
        self.assertEqual((r["batch"], r["steps"], r["accumulation"]), (5, 3, 2))
        self.assertEqual(len(r["step_seconds"]), 3)

    def test_hf_trainer_callback(self):
        transformers = types.ModuleType("transformers")
        transformers.TrainerCallback = type("TrainerCallback", (), {})
        self.install({"transformers": transformers})
        bt.__dict__.pop("BatchfitTrainerCallback", None)
        self.trial_env()
        cb = bt.BatchfitTrainerCallback()
        args = types.SimpleNamespace(per_device_train_batch_size=8, gradient_accumulation_steps=4,
                                     process_index=1, world_size=2)
        cb.on_train_begin(args, None, None)
        for _ in range(2):
            cb.on_step_end(args, None, None)
        cb.on_train_end(args, None, None)
        r = self.read(self.result + ".rank1")
        self.assertEqual((r["batch"], r["steps"], r["accumulation"], r["rank"], r["world_size"]), (8, 2, 4, 1, 2))


def have(module):
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


@unittest.skipUnless(have("torch"), f"torch is not importable by {sys.executable}: run with the libtorch venv's python")
class WithTorch(HelperCase):
    def test_torch_version_is_reported_and_cuda_is_null_without_cuda_init(self):
        import torch
        self.trial_env()
        bt.report(batch=2, steps=1)
        r = self.read()
        self.assertEqual(r["torch"], torch.__version__)
        if not torch.cuda.is_initialized():
            self.assertIsNone(r["cuda"])

    @unittest.skipUnless(have("torch") and __import__("torch").cuda.is_available(), "no CUDA device")
    def test_cuda_statistics(self):
        import torch
        self.trial_env()
        x = torch.ones(1 << 20, device="cuda")
        with bt.Trial(batch=2) as t:
            (x * 2).sum().item()
            t.step()
        cuda = self.read()["cuda"]
        self.assertEqual(set(cuda), {"device", "peak_allocated_bytes", "peak_reserved_bytes", "reserved_bytes",
                                     "alloc_retries", "ooms"})
        self.assertTrue(cuda["device"].startswith("cuda:"))
        self.assertGreaterEqual(cuda["peak_allocated_bytes"], 4 << 20)
        self.assertGreaterEqual(cuda["peak_reserved_bytes"], cuda["peak_allocated_bytes"])


def run_script(script, args, env, launcher=(sys.executable,)):
    """Runs one of the training scripts next to this file (with `launcher`: python, or torchrun and its
    flags), the helper importable through PYTHONPATH."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFIT_")}
    full_env.update(env)
    full_env["PYTHONPATH"] = HELPER_DIR
    return subprocess.run([*launcher, os.path.join(HERE, script), *args], capture_output=True, text=True,
                          env=full_env, stdin=subprocess.DEVNULL, timeout=300)


@unittest.skipUnless(have("torch"), f"torch is not importable by {sys.executable}: run with the libtorch venv's python")
class TrainingScripts(unittest.TestCase):
    """train_mlp.py (and train_ddp.py under torchrun when it is next to this python) end to end, small."""

    def test_train_mlp_without_batchfit_writes_nothing(self):
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([sys.executable, os.path.join(HERE, "train_mlp.py"), "--batch-size", "4", "--steps", "2"],
                               capture_output=True, text=True, cwd=tmp, timeout=300,
                               env={k: v for k, v in os.environ.items() if not k.startswith("BATCHFIT_")})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("trained batch 4 x accumulation 1 for 2 steps", p.stdout)
            self.assertEqual(os.listdir(tmp), [])

    def test_train_mlp_reports_what_batchfit_asked(self):
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "r.json")
            p = run_script("train_mlp.py", [], {"BATCHFIT_BATCH": "6", "BATCHFIT_STEPS": "2",
                                                "BATCHFIT_ACCUMULATION": "3", "BATCHFIT_TRIAL": "0",
                                                "BATCHFIT_RESULT": result})
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(result) as f:
                r = json.load(f)
            self.assertEqual((r["batch"], r["steps"], r["accumulation"], r["reads_accumulation"]), (6, 2, 3, True))
            self.assertEqual(len(r["step_seconds"]), 2)
            self.assertIsNotNone(r["torch"])

    def test_train_ddp_under_torchrun_reports_every_rank(self):
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        if not os.path.exists(torchrun):
            self.skipTest(f"no torchrun next to {sys.executable}")
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "r.json")
            p = run_script("train_ddp.py", ["--batch-size", "5", "--steps", "2",
                                            "--accumulation", "2"],
                           {"BATCHFIT_RESULT": result, "BATCHFIT_TRIAL": "0"},
                           launcher=(torchrun, "--nproc-per-node", "2"))
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("world 2 x micro-batch 5 x accumulation 2 = global batch 20", p.stdout)
            for path, rank in ((result, 0), (result + ".rank1", 1)):
                with open(path) as f:
                    r = json.load(f)
                self.assertEqual((r["batch"], r["steps"], r["accumulation"], r["rank"], r["world_size"]),
                                 (5, 2, 2, rank, 2))


@unittest.skipUnless(have("lightning") or have("pytorch_lightning"),
                     f"Lightning is not importable by {sys.executable}: run with the benchmark venv's python")
class RealLightning(unittest.TestCase):
    def test_callback_reports_optimizer_steps_with_accumulation(self):
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "r.json")
            p = run_script("train_lightning.py", [], {"BATCHFIT_BATCH": "7", "BATCHFIT_STEPS": "3",
                                                      "BATCHFIT_ACCUMULATION": "2", "BATCHFIT_TRIAL": "0",
                                                      "BATCHFIT_RESULT": result})
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            with open(result) as f:
                r = json.load(f)
            self.assertEqual((r["batch"], r["steps"], r["accumulation"]), (7, 3, 2))
            self.assertEqual(len(r["step_seconds"]), 3)


if __name__ == "__main__":
    unittest.main()
