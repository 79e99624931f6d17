"""`gnnio doctor`: what this machine can run, and why not."""

from __future__ import annotations

from dataclasses import asdict

import click

from gnnio_cli.cli.output import emit_json, key_value_table, note, stdout, table


@click.command("doctor")
@click.option("--build", is_flag=True, help="Build and load the native extension first (minutes on a first run).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else.")
def command(build, as_json):
    """Print Python, torch, CUDA, GPU, nvcc and ninja versions, the arch list,
    the native build cache, its build time, the ops it provides, and which
    backends are available (and why not).

    Exits 0 when the reference backend works; with --build, exits 1 unless the
    native kernels loaded too.
    """
    from gnnio_cli import native
    from gnnio_cli.errors import GnnioError

    if build and not as_json:
        note("building the native extension (first build takes minutes)...")
    status = native.status(build=build)
    distributed = distributed_status()
    if as_json:
        emit_json({**asdict(status), "distributed": distributed})
    else:
        stdout.print(
            key_value_table(
                "gnnio doctor",
                [
                    ("Python", status.python),
                    ("torch", status.torch),
                    ("torch CUDA", status.torch_cuda or "none (CPU-only build)"),
                    ("GPU", f"{status.gpu} (capability {status.gpu_capability})" if status.gpu else "none visible"),
                    ("CUDA_HOME", status.cuda_home),
                    ("nvcc", status.nvcc),
                    ("ninja", status.ninja),
                    ("arch list", status.arch_list),
                    ("build cache", status.cache_dir),
                    ("built", status.built),
                    ("build time (s)", status.build_seconds),
                    ("native ops", ", ".join(status.ops) if status.ops else None),
                ],
            )
        )
        stdout.print(table("Backends", ["backend", "status"], sorted(status.backends.items())))
        stdout.print(key_value_table("Several devices (gnnio run --gpus N)", [
            ("GPUs visible", distributed["gpus"]),
            ("NCCL", distributed["nccl"] or "not available"),
            ("gloo (CPU ranks)", distributed["gloo"]),
        ]))
    if build and not status.loaded:
        raise GnnioError(status.reason or "native extension did not load")


def distributed_status() -> dict:
    """GPUs visible, torch's NCCL version ("2.27.3"; None without CUDA or NCCL), whether gloo is built in."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = None
    if gpus and dist.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return {"gpus": gpus, "nccl": nccl, "gloo": dist.is_available() and dist.is_gloo_available()}
