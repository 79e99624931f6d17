"""`gnnio train`: GCN or GAT on Cora/CiteSeer over several seeds, with gnnio's layers and PyG's."""

from __future__ import annotations

from pathlib import Path

import click

from gnnio_cli.cli.output import DelayedProgress, emit_json, key_value_table, note, stdout, table

RESULT_COLUMNS = ["library", "mean test acc", "std", "min", "max", "ms / epoch"]


@click.command("train")
@click.option("--model", type=click.Choice(["gcn", "gat"]), required=True, help="GCN (2 layers, hidden 16) or GAT (8 heads x 8).")
@click.option("--dataset", type=click.Choice(["cora", "citeseer"]), default="cora", show_default=True,
              help="Planetoid graph, public split.")
@click.option("--seeds", default=10, show_default=True, type=click.IntRange(1), help="Runs, seeded 0..seeds-1.")
@click.option("--epochs", default=200, show_default=True, type=click.IntRange(1))
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Default: cuda when a GPU is visible, else cpu.")
@click.option("--against-pyg/--no-against-pyg", default=True, show_default=True,
              help="Also train with PyG's layers (same seeds, same weights at start) when torch-geometric is installed.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder with the raw ind.<name>.* files (or a Planetoid root). "
              "Default: the copies bundled with gnnio (sample_graphs/planetoid).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout and nothing else.")
def command(model, dataset, seeds, epochs, device, against_pyg, data_dir, as_json):
    """Train MODEL on a Planetoid graph and print the mean and standard deviation of test accuracy.

    Hyper-parameters follow PyG's examples (GCN: lr 0.01, weight decay 5e-4 on
    the first layer, dropout 0.5; GAT: lr 0.005, weight decay 5e-4, dropout
    0.6). Accuracy is the test accuracy at the epoch of best validation
    accuracy; std is the sample standard deviation over seeds.
    """
    from gnnio_cli.train import train

    def progress(library, run):
        note(f"{library} seed {run.seed}: test {run.test_accuracy:.3f} (best val {run.val_accuracy:.3f} at epoch "
             f"{run.best_epoch}), {run.seconds_per_epoch * 1000:.1f} ms/epoch")

    with DelayedProgress(("loading",), delay=0.5) as bar:
        def on_epoch(library, seed, epoch):
            bar.update(f"{library} seed {seed + 1}/{seeds}", seed * epochs + epoch, seeds * epochs)

        report = train(model, dataset, seeds=seeds, epochs=epochs, device=device, against_pyg=against_pyg,
                       data_dir=data_dir, progress=progress, on_epoch=on_epoch)
    if report.pyg_missing:
        note(f"PyG's layers not trained: torch_geometric is not importable ({report.pyg_missing})")
    if as_json:
        emit_json({
            "model": report.model, "dataset": report.dataset, "epochs": report.epochs, "seeds": report.seeds,
            "device": report.device, "raw_dir": report.raw_dir, "pyg_missing": report.pyg_missing,
            "results": [
                {"library": result.library, "mean": result.mean, "std": result.std,
                 "seconds_per_epoch": result.seconds_per_epoch, "runs": result.runs}
                for result in report.libraries
            ],
        })
        return
    stdout.print(key_value_table(f"gnnio train: {model} on {dataset}", [
        ("data", report.raw_dir), ("split", "public (Planetoid)"), ("seeds", seeds), ("epochs", epochs),
        ("device", report.device),
    ]))
    rows = [
        [result.library, result.mean, result.std, min(result.accuracies), max(result.accuracies),
         result.seconds_per_epoch * 1000]
        for result in report.libraries
    ]
    stdout.print(table("Test accuracy at best validation epoch", RESULT_COLUMNS, rows))
    by_library = {result.library: result for result in report.libraries}
    if "pyg" in by_library:
        gap = (by_library["gnnio"].mean - by_library["pyg"].mean) * 100
        stdout.print(f"gnnio - pyg: {gap:+.2f} points of mean test accuracy")
