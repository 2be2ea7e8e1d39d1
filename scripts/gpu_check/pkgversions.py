"""Installed versions of the Python packages gpu-check's table is stamped with (check.py and peers.py)."""
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
