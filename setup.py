"""The one thing pyproject.toml cannot say: the repository's top-level folders install
under one import namespace, `clawsup`. Each folder's packages are found, not listed,
so a new sub-package ships without touching this file."""

from setuptools import find_packages, setup

# import name -> folder. `clawsup` itself (and `clawsup.v1`, the generated wire
# protocol) lives under proto/ so that protoc's imports (`from clawsup.v1 import
# host_pb2`) resolve without rewriting.
ROOTS = {
    "clawsup": "proto/clawsup",
    "clawsup.supervisor": "supervisor",
    "clawsup.sandbox": "sandbox",
    "clawsup.plugins": "plugins",
}

packages = []
for name, folder in ROOTS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=ROOTS)
