"""Installed versions of the Python packages a harness's results are stamped with (gpu-check's check.py and
peers.py), read from the package metadata without importing the packages."""
import sys

PACKAGES = ("torch", "lightning", "pytorch-lightning", "accelerate", "torchvision")


def package_versions(packages=PACKAGES):
    """{"python": X.Y.Z, package: version or None (not installed)}, without importing the packages."""
    v = {"python": sys.version.split()[0]}
    try:
        import importlib.metadata as md
    except ImportError:
        return v
    for pkg in packages:
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    return v
