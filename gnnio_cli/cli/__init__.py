"""The `gnnio` command: a click group whose subcommands load on demand.

Each subcommand lives in its own module (``gnnio_cli/cli/<name>.py``) and is
imported only when invoked, so a graph command never loads the layers,
kernels and benchmarks it does not use.

Every failure ends here, in :func:`main`, as one line on stderr and a
non-zero exit status: user errors (:class:`GnnioError`, usage errors: 1 and
2), the operating system's (a full disk, permissions: 1), running out of
memory (1), interruptions (SIGINT 130, SIGTERM 143, SIGHUP 129: raised as
exceptions so that temporary files are removed on the way out) and, for a
bug, a line that says so (1). ``--verbose`` shows the traceback too.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading

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
    "partition": "partition",
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


# click >= 8.2 raises this for a bare group (`gnnio`, `gnnio generate`); older versions print the help and exit 0.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """A termination signal turned into an exception, so `finally` blocks (temporary files) run on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signum)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, status: int) -> None:
    click.echo(f"gnnio: {message}", err=True)
    sys.exit(status)


def main(argv=None) -> None:
    from gnnio_cli.errors import GnnioError

    verbose = "--verbose" in (argv if argv is not None else sys.argv[1:])
    previous = {}
    if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
        previous = {signum: signal.signal(signum, _raise_terminated) for signum in _HANDLED_SIGNALS}
    try:
        cli.main(args=argv, prog_name="gnnio", standalone_mode=False)
    except GnnioError as err:
        if verbose:
            raise
        _fail(f"error: {err}", 1)
    except click.exceptions.Abort as err:  # click's form of KeyboardInterrupt (after a newline past the ^C)
        _fail("interrupted" if isinstance(err.__cause__, KeyboardInterrupt) else "aborted", 130)
    except _NO_ARGS_IS_HELP as err:
        err.show()  # the group's help, as written
        sys.exit(err.exit_code)
    except click.ClickException as err:
        # Usage errors too become one line; `--help` shows the full usage.
        hint = ""
        if isinstance(err, click.UsageError) and err.ctx is not None:
            hint = f" (see '{err.ctx.command_path} --help')"
        _fail(f"error: {_one_line(err.format_message())}{hint}", err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Terminated as err:
        _fail(f"terminated by {signal.Signals(err.signum).name}", 128 + err.signum)
    except MemoryError as err:
        if verbose:
            raise
        _fail(f"error: out of memory{f' ({_one_line(err)})' if str(err) else ''}; try a smaller graph or a larger machine", 1)
    except OSError as err:
        if verbose:
            raise
        where = f"{err.filename}: " if err.filename else ""
        _fail(f"error: {where}{_one_line(err.strerror or err)}", 1)
    except Exception as err:  # a bug in gnnio, not the user's doing: still one line, the traceback on request
        if verbose:
            raise
        _fail(f"internal error: {type(err).__name__}: {_one_line(err)[:300]} (rerun with --verbose for the traceback "
              "and please report it)", 1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
