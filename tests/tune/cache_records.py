"""Records and files for the autotune cache's tests: a matmul record with every field settable."""

from __future__ import annotations

from pathlib import Path

from tessera_rw.tune.records import TuneRecord

MM = ((128, 64), (64, 256))
BF16 = ("bf16", "bf16")
CONFIG = {"bm": 128, "bn": 128, "bk": 32, "warps_m": 2, "warps_n": 2, "stages": 3, "fusion_depth": 1}


def rec(shapes=MM, time_us=10.0, chosen_by="on_device", op_name="matmul", signature_hash="9f2c", dtypes=BF16,
        arch="H100-SXM", config=CONFIG, versions=None, **more) -> TuneRecord:
    r = TuneRecord.create(op_name=op_name, signature_hash=signature_hash, shapes=shapes, dtypes=dtypes, arch=arch,
                          config=config, time_us=time_us, chosen_by=chosen_by, noise_us=0.3, trials=12,
                          versions=versions)
    return r.model_copy(update=more) if more else r


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
