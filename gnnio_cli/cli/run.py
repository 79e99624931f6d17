"""`gnnio run`: execute one layer on a graph and print timing and memory."""

from __future__ import annotations

import click

from gnnio_cli.cli import options
from gnnio_cli.cli.output import DelayedProgress, emit_json, key_value_table, stdout, table


@click.command("run")
@click.option("--layer", required=True, type=click.Choice(options.LAYER_CHOICES), help="Layer to run.")
@options.graph_option
@options.workload_options
@click.option("--backend", type=click.Choice(["auto", "native", "reference"]), default="auto", show_default=True,
              help="auto: native kernels on CUDA when built, else the PyTorch reference.")
@click.option("--aggregation-only", is_flag=True, help="Time the layer's aggregation alone (no projections).")
@options.timing_options
@click.option("--profile", is_flag=True,
              help="Also run one more step under torch.profiler and list its costliest kernels.")
@options.minibatch_options
@click.option("--against", default="", help="Mini-batch mode: also time PyG's layers with the same weights (pyg).")
@options.distributed_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else.")
def command(layer, graph, features, heads, dtype, device, backend, aggregation_only, backward, repeat, warmup, seed, profile,
            batch_size, fanout, classes, steps, rounds, against, ranks, order, baseline, timeout, gpu_memory, as_json):
    """Run LAYER on a graph with seeded random weights and features.

    Prints forward and forward+backward time (median, min, max over --repeat
    calls after --warmup), peak memory, the graph, the device and the backend
    and kernels that actually ran. Without --graph, the bundled Cora sample.

    With --batch-size and --fanout (mini-batch mode), trains a model of one
    LAYER per hop (gat, gatv2, transformer, sage-mean, gcn) on batches sampled
    by gnnio's loader and prints the time per step: sampling, gnnio on each
    batch's edge_index and on the loader's graph, the compute alone, and PyG
    with --against pyg.

    With --gpus N (distributed mode; --graph G.h5), splits the graph's rows
    across N ranks (one GPU each; CPU processes on gloo with --device cpu),
    trains a 2-layer LAYER model on the whole graph and prints each rank's
    step time, halo exchange time (and how much of it was not hidden behind
    the rows that read no halo) and bytes, gradient all-reduce time and peak
    memory, and the speedup over the same model on one device. Started by
    torchrun, it joins torchrun's group instead of spawning (--gpus is then
    torchrun's world size).
    """
    from gnnio_cli.bench import report

    ranks = options.distributed_ranks(ranks, graph)
    if ranks is not None:
        unused = [name for name, given in (("--batch-size", batch_size is not None), ("--backend", backend != "auto"),
                                           ("--aggregation-only", aggregation_only), ("--profile", profile),
                                           ("--no-backward", not backward)) if given]
        if unused:
            raise click.UsageError(f"--gpus trains a 2-layer model on the whole graph; {', '.join(unused)} does not apply")
        show_distributed(layer, graph, features, heads, dtype, report.default_device(device), order, warmup, repeat,
                         seed, ranks, baseline, timeout, gpu_memory, as_json)
        return
    if gpu_memory is not None:
        raise click.UsageError("--gpu-memory caps the GPUs of distributed mode; give --gpus N")

    if options.check_minibatch(batch_size, fanout):
        show_minibatch([layer], graph, fanout, batch_size, features, classes, heads, device, against, warmup, steps,
                       rounds, seed, as_json)
        return

    with DelayedProgress((f"measuring {layer}",)):
        result = report.run_layer(
            layer=layer, graph_spec=graph, features=features, heads=heads, dtype=dtype, device=device,
            backend=backend, aggregation_only=aggregation_only, backward=backward, repeat=repeat, warmup=warmup,
            seed=seed, profile=profile,
        )
    if as_json:
        emit_json(result)
        return
    stdout.print(key_value_table(f"gnnio run: {layer}", report.summary_pairs(result)))
    stdout.print(table("Timing and peak memory", report.TIMING_COLUMNS, report.timing_rows(result["measurement"])))
    if profile:
        from gnnio_cli.bench.kernel_profile import PROFILE_COLUMNS, profile_rows

        profiled = result["profile"]
        title = f"Where one {profiled['step']} step's time goes ({profiled['device']}, {profiled['device_total_ms']:.2f} ms in all)"
        stdout.print(table(title, PROFILE_COLUMNS, profile_rows(profiled)))


def show_minibatch(layers, graph, fanout, batch_size, features, classes, heads, device, against, warmup, steps, rounds,
                   seed, as_json) -> None:
    """Run and print mini-batch mode for each of `layers` (shared by `run` and `compare`)."""
    from gnnio_cli.bench import minibatch
    from gnnio_cli.cli.output import note

    against = [item.strip() for item in against.split(",") if item.strip()] if isinstance(against, str) else against
    documents = []
    for layer in layers:
        documents.append(minibatch.run_minibatch(
            model=layer, graph_spec=graph, fanout=fanout, batch_size=batch_size, features=features, hidden=features,
            classes=classes, heads=heads, device=device, against=against, warmup=max(warmup, 1), steps=steps,
            rounds=rounds, seed=seed, progress=None if as_json else note,
        ))  # fmt: skip
    if as_json:
        emit_json(documents[0] if len(documents) == 1 else {"command": "compare", "mode": "mini-batch",
                                                            "results": documents})
        return
    for document in documents:
        info, batches, settings = document["graph"], document["batches"], document["settings"]
        stdout.print(key_value_table(f"gnnio mini-batch: {document['layers']}-layer {document['model']}", [
            ("graph", f"{info['name']} ({info['num_nodes']:,} nodes, {info['num_edges']:,} edges)"),
            ("batches", f"{settings['batch_size']:,} seeds, fan-out {','.join(map(str, settings['fanout']))}: "
                        f"{batches['mean_nodes']:,.0f} nodes, {batches['mean_edges']:,.0f} edges on average"),
            ("device", f"{document['environment']['device']} ({document['environment']['device_name']})"),
            ("structure share of a step", document["summary"]["structure_share_loader_graph"]),
        ]))
        stdout.print(table("Time per training step (sampling: per batch)", minibatch.MINIBATCH_COLUMNS,
                           minibatch.minibatch_rows(document)))


def show_distributed(layer, graph, features, heads, dtype, device, order, warmup, repeat, seed, ranks, baseline, timeout,
                     gpu_memory, as_json) -> None:
    """Run and print distributed mode (see `command`)."""
    from gnnio_cli.bench import distributed

    settings = distributed.RunSettings(graph=graph, layer=layer, features=features, heads=heads, dtype=dtype,
                                       device=device, order=order, warmup=warmup, repeat=repeat, seed=seed,
                                       gpu_memory_gib=gpu_memory)
    with DelayedProgress((f"training a {distributed.DEPTH}-layer {layer} on {ranks} ranks",), enabled=not as_json):
        document = distributed.run_distributed(settings, ranks, baseline=baseline, timeout=timeout)
    if document is None:  # a torchrun rank other than 0: rank 0 reports for all
        return
    if as_json:
        emit_json(document)
        return
    total, environment = document["total"], document["environment"]
    stdout.print(key_value_table(f"gnnio run: {distributed.DEPTH}-layer {layer} on {len(document['ranks'])} ranks", [
        ("graph", f"{graph} ({document['graph']['num_nodes']:,} nodes, {document['graph']['num_edges']:,} edges)"),
        ("partition order", order),
        ("device", f"{environment['device']} ({environment['device_name']}), {environment['backend']}"),
        ("step (ms, slowest rank's median)", total["step_ms"]),
        ("halo bytes per step, all ranks", total["halo_bytes_per_step"]),
        ("halo exchange per step (ms, slowest rank)", total["halo_exchange_ms_max"]),
        ("of which exposed (ms, slowest rank)", total["halo_exposed_ms_max"]),
    ]))
    stdout.print(table("Per rank (median of the timed steps)", distributed.RANK_COLUMNS,
                       distributed.rank_rows(document["ranks"])))
    stdout.print(table("Scaling against one device", distributed.SCALING_COLUMNS,
                       distributed.scaling_rows(document["baseline"], document["ranks"])))
