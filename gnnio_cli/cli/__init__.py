"""The `gnnio` command: a click group whose subcommands load on demand.

Each subcommand lives in its own module (``gnnio_cli/cli/<name>.py``) and is
imported only when invoked, so a graph command never loads the layers,
kernels and benchmarks it does not use. User errors (:class:`GnnioError`) become one line on stderr and exit
status 1; ``--verbose`` shows the traceback too.
"""

from __future__ import annotations

import importlib
import sys

import click

# command name -> module under gnnio_cli.cli holding a click command named `command`
SUBCOMMANDS = {
    "convert": "convert",
    "generate": "generate",
    "profile-degree": "profile_degree",
    "reorder": "reorder",
    "run": "run",
    "compare": "compare",
    "doctor": "doctor",
    "train": "train",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx, name):
        module_name = SUBCOMMANDS.get(name)
        if module_name is None:
            return None
        module = importlib.import_module(f"gnnio_cli.cli.{module_name}")
        return module.command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--verbose", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="gnnio", prog_name="gnnio")
@click.pass_context
def cli(ctx, verbose):
    """gnnio: IO-aware GNN layers on GPUs, and the tools to measure them.

    Convert edge lists to cached graphs, reorder and profile them, and run or
    compare GNN layers through native CUDA kernels or the PyTorch reference.
    """
    ctx.obj = {"verbose": verbose}


def main(argv=None) -> None:
    from gnnio_cli.errors import GnnioError

    verbose = "--verbose" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="gnnio", standalone_mode=False)
    except GnnioError as err:
        if verbose:
            raise
        click.echo(f"gnnio: error: {err}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("gnnio: aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        # Usage errors too become one line; `--help` shows the full usage.
        hint = ""
        if isinstance(err, click.UsageError) and err.ctx is not None:
            hint = f" (see '{err.ctx.command_path} --help')"
        message = " ".join(err.format_message().split())
        click.echo(f"gnnio: error: {message}{hint}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except KeyboardInterrupt:
        click.echo("gnnio: interrupted", err=True)
        sys.exit(130)
