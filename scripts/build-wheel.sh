#!/usr/bin/env bash
# build-wheel.sh: builds the one batchfit wheel (`pip install batchfit-….whl`): the `batchfit` and
# `batchfit-train` commands, the torch runner `batchfit-torch`, and the `batchfit` Python package (the
# trial helper). Prints the wheel's path as the LAST line of stdout; everything else goes to stderr.
#
#   scripts/build-wheel.sh                 # the wheel lands in <cargo target dir>/wheels/
#   WHEEL=$(scripts/build-wheel.sh | tail -n 1)
#
# How the wheel is made (pyproject.toml holds the maturin settings):
#   1. cargo builds the runner (workspace package crates/batchfit-torch) against the torch of
#      scripts/setup-libtorch.sh, or $LIBTORCH (a …/site-packages/torch directory). maturin builds one
#      package's binaries only, so the runner is built first and handed to maturin as wheel data:
#      target/wheel-data/scripts/batchfit-torch (pyproject's `data`), which maturin puts in the wheel's
#      batchfit-VERSION.data/scripts/ and pip installs into the same bin/ as `batchfit`. The runner
#      keeps no RUNPATH: `batchfit` starts it with the user's torch/lib on LD_LIBRARY_PATH.
#   2. maturin builds the root package (bindings = "bin": `batchfit`, `batchfit-train`, no libtorch)
#      and the Python package from python/, in cargo's own target directory, so a built tree is reused,
#      and audits the two commands with --auditwheel check: they may need only libraries every
#      manylinux system has (glibc, libgcc_s, libm); the platform tag is the most compatible one their
#      symbol versions allow (maturin's default).
#   3. auditwheel (pypa's reference checker) then reads every ELF file in the finished wheel, the
#      runner included, which maturin's check does not see (it audits what it built). Passing only when
#      (a) the versioned symbols of all three binaries (glibc, libstdc++, libgcc) fit the wheel's tag;
#      the runner is built on this machine, so when it needs a newer glibc or libstdc++ than the
#      commands, the wheel is built again with that tag (--compatibility): the tag is always true for
#      all three; (b) the only libraries outside the tag's set are libtorch's own (libtorch*.so,
#      libc10*.so), which the runner needs from the user's torch, as a Python extension needs
#      libpython. They are not put in the wheel (that would be a second, mismatched copy of torch, 1+ GB)
#      and maturin's repair is not run. The torch wheels on PyPI are themselves manylinux_2_28, so
#      every system they install on has the glibc libtorch needs; the wheel's own tag says what the
#      batchfit binaries need on top.
#   4. No Requires-Dist: torch is the user's (a dependency would let pip replace their CUDA build).
#
# Tools: maturin and auditwheel are pip-installed, when missing, into a venv of their own under
# ${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/wheel-tools (BATCHFIT_WHEEL_TOOLS overrides); never into
# the system python. CARGO_TARGET_DIR is honoured (the runner is taken from it).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

MATURIN_REQ='maturin>=1.9,<2'
AUDITWHEEL_REQ='auditwheel>=6.8,<7' # 6.8: `auditwheel show --json`
TOOLS=${BATCHFIT_WHEEL_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/batchfit/wheel-tools}

say() { echo "build-wheel: $*" >&2; }
die() { say "$*"; exit 1; }

[ -f crates/batchfit-torch/Cargo.toml ] \
  || die "crates/batchfit-torch/Cargo.toml is missing: the wheel needs the runner's workspace package"

# --- tools -------------------------------------------------------------------------------------------
tools_ok() { "$TOOLS/bin/maturin" --version > /dev/null 2>&1 && "$TOOLS/bin/auditwheel" --version > /dev/null 2>&1; }
if ! tools_ok; then
  mkdir -p "$(dirname "$TOOLS")"
  exec 9> "$TOOLS.lock" # two builds at once install once
  flock 9
  if ! tools_ok; then
    say "installing $MATURIN_REQ and $AUDITWHEEL_REQ into $TOOLS"
    [ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "$MATURIN_REQ" "$AUDITWHEEL_REQ" >&2
  fi
  exec 9>&-
fi
say "$("$TOOLS/bin/maturin" --version), $("$TOOLS/bin/auditwheel" --version 2>&1 | head -n 1 | cut -d' ' -f1-2)"

# --- 1. the runner -----------------------------------------------------------------------------------
LIBTORCH=${LIBTORCH:-$("$here/setup-libtorch.sh")}
[ -f "$LIBTORCH/lib/libtorch_cpu.so" ] || die "LIBTORCH=$LIBTORCH holds no lib/libtorch_cpu.so"
export LIBTORCH
target_dir=$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
say "cargo build --release -p batchfit-torch (LIBTORCH=$LIBTORCH)"
cargo build --release -p batchfit-torch --bin batchfit-torch >&2
runner=$target_dir/release/batchfit-torch
[ -x "$runner" ] || die "cargo built no $runner"
if readelf -d "$runner" | grep -Eq '\((RUNPATH|RPATH)\)'; then
  die "$runner has a RUNPATH/RPATH ($(readelf -d "$runner" | grep -E 'R(UN)?PATH' | tr -s ' ')): it would point into this build's venv on every user's machine"
fi

data=$root/target/wheel-data
rm -rf "$data"
mkdir -p "$data/scripts"
# A stripped copy (binutils' strip; maturin strips only what it builds): the symbol table is no use
# to users and a third of the file.
strip --strip-all -o "$data/scripts/batchfit-torch" "$runner"

# --- 2. the wheel ------------------------------------------------------------------------------------
out=$target_dir/wheels
mkdir -p "$out"
build() { # build [maturin flags…]: the wheel's path
  rm -f "$out"/batchfit-*.whl
  "$TOOLS/bin/maturin" build --release --auditwheel check --out "$out" "$@" >&2
  local wheels=("$out"/batchfit-*.whl)
  if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
    die "maturin left ${#wheels[@]} wheels in $out: ${wheels[*]}"
  fi
  echo "${wheels[0]}"
}
say "maturin build (the commands and the Python package; the runner as data)"
wheel=$(build)

# --- 3. the whole wheel, runner included, against its tag ----------------------------------------------
audit() { # audit WHEEL: prints the manylinux tag the binaries' symbol versions need, or dies
  local json
  json=$(mktemp)
  # Without torch's lib directory on the search path: libtorch stays unresolved, so what is reported
  # are the binaries' own needs, not those of the user's torch.
  env -u LD_LIBRARY_PATH -u AUDITWHEEL_LD_LIBRARY_PATH "$TOOLS/bin/auditwheel" show --json "$1" > "$json" 2> "$json.err" \
    || die "auditwheel show $1 failed: $(tail -n 5 "$json.err")"
  python3 - "$json" "$(basename "$1")" << 'EOF' || die "auditwheel: $1 is not what its tag says (above)"
import json, re, sys
w = json.load(open(sys.argv[1]))
tag = sys.argv[2][:-len(".whl")].split("-")[-1]  # e.g. manylinux_2_35_x86_64
def glibc(t):
    m = re.match(r"manylinux_(\d+)_(\d+)_", t)
    return (int(m.group(1)), int(m.group(2))) if m else None
problems = []
if glibc(tag) is None:
    problems.append(f"the wheel is tagged {tag}, not manylinux")
sym = w["sym_tag"]
if glibc(sym) is None:
    problems.append(f"the binaries' symbol versions fit no manylinux policy ({sym}): {w['versioned_symbols']}")
if w.get("unsupported_isa"):
    problems.append("a binary needs an instruction set above the baseline")
torch_lib = re.compile(r"^lib(torch|torch_cpu|torch_cuda|torch_global_deps|c10|c10_cuda)\.so(\.\d+)*$")
external = sorted(w.get("external_libs", {}))
others = [lib for lib in external if not torch_lib.match(lib)]
if others:
    problems.append(f"libraries outside the manylinux set that are not libtorch's: {others}")
if not any(torch_lib.match(lib) for lib in external):
    problems.append("no binary needs libtorch: is the runner in the wheel?")
if problems:
    sys.exit("auditwheel: " + "; ".join(problems))
print(sym)
EOF
  rm -f "$json" "$json.err"
}
tag_of() { local n; n=$(basename "$1" .whl); echo "${n##*-}"; }
sym_tag=$(audit "$wheel")
tag=$(tag_of "$wheel")
glibc_of() { sed -E 's/^manylinux_([0-9]+)_([0-9]+)_.*/\1 \2/' <<< "$1"; }
read -r tmaj tmin <<< "$(glibc_of "$tag")"
read -r smaj smin <<< "$(glibc_of "$sym_tag")"
if [ "$smaj" -gt "$tmaj" ] || { [ "$smaj" -eq "$tmaj" ] && [ "$smin" -gt "$tmin" ]; }; then
  compat=$(sed -E 's/^(manylinux_[0-9]+_[0-9]+)_.*/\1/' <<< "$sym_tag") # manylinux_2_36_x86_64 → manylinux_2_36
  say "the runner needs $sym_tag, more than the commands' $tag: building again with --compatibility $compat"
  wheel=$(build --compatibility "$compat")
  sym_tag=$(audit "$wheel")
  tag=$(tag_of "$wheel")
  [ "$(glibc_of "$tag")" = "$(glibc_of "$compat")" ] || die "maturin tagged $wheel, not $compat"
fi
python3 - "$wheel" << 'EOF' || die "$wheel: unexpected contents (above)"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["batchfit/__init__.py", "batchfit/__main__.py", "batchfit/batchfit_trial.py"]
need += [n for n in names if n.endswith(".data/scripts/batchfit")][:1] or ["…data/scripts/batchfit"]
for cmd in ("batchfit-train", "batchfit-torch"):
    need += [n for n in names if n.endswith(".data/scripts/" + cmd)][:1] or ["…data/scripts/" + cmd]
missing = [n for n in need if n not in names]
meta = [n for n in names if n.endswith(".dist-info/METADATA")]
requires = [l for l in zipfile.ZipFile(sys.argv[1]).read(meta[0]).decode().splitlines()
            if l.startswith("Requires-Dist:")] if meta else ["(no METADATA)"]
if missing or requires:
    sys.exit(f"missing {missing}; Requires-Dist {requires}")
EOF
say "$wheel: $(du -h "$wheel" | cut -f1), tag $tag (auditwheel: the binaries' symbol versions need $sym_tag; libtorch from the user's torch)"
echo "$wheel"
