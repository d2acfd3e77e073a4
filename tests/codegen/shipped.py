"""The templates this repository ships: the built-in ones and the example plugin's. Tests that hold
a template to a committed file (a source snapshot, the emulator's coverage) take only these; a
third party's installed template is still held to the contract by the tests that take them all."""

from tessera_rw.codegen.templates.registry import templates

SHIPPED_PACKAGES = ("tessera_rw", "tessera_rw_rmsnorm_matmul")


def shipped_templates() -> list:
    return [t for t in templates() if type(t).__module__.split(".")[0] in SHIPPED_PACKAGES]
