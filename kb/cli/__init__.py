"""The `remedy` command line: a thin adapter over the KnowledgeBase and the case machinery.

Each command parses its arguments, calls one core function and renders the
result (a rich table, or JSON with ``--json``). Commands live in the
modules of this package by area; this module registers them all and maps every
:class:`RemedyError` to one red line on stderr and exit status 1.

Import policy (the one place in the project where imports inside functions are the rule): a
command imports its domain modules (the KnowledgeBase facade, evidence, verification, retrieval,
the case models) inside the command function, so ``remedy --help``, ``remedy kb stats``,
``remedy case show`` and ``remedy kb export`` load no torch, sentence-transformers, LanceDB,
scipy.stats, numpy or case models (``tests/kb/test_cli_imports.py`` enforces it). Everywhere
else imports sit at the top of the module; an import inside a function elsewhere defers a heavy
library (SB3, torch, gymnasium's envs) and says so in a comment, and never hides an import loop
(``bench/house.py`` counts the loops).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.exceptions import TyperException

from remedy.cases.errors import RemedyError
from remedy.retrieval.offline_env import offline_defaults

from . import (
    adopt,
    bench,
    diagnose,
    doctor,
    factory,
    jobs,
    kb,
    lm,
    optimize,
    patch,
    report,
    rules,
    serve,
    signature,
    tokens,
    verify,
)

__all__ = ["app", "main"]

app = typer.Typer(
    name="remedy",
    help="Remedy: diagnose why a trained RL agent fails, patch it, verify the patch, and remember.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
kb_app = typer.Typer(help="Create, inspect, import, export and reindex the knowledge base.", no_args_is_help=True)
case_app = typer.Typer(help="Look at stored cases.", no_args_is_help=True)
patch_app = typer.Typer(help="Check patch files before they are used.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Fault-scenario suite: build the broken agents, run the fix loop on them.", no_args_is_help=True
)
app.add_typer(kb_app, name="kb")
app.add_typer(case_app, name="case")
app.add_typer(patch_app, name="patch")
app.add_typer(bench_app, name="bench")
tokens_app = typer.Typer(help="API tokens for `remedy serve` (create one per person or CI job).", no_args_is_help=True)
app.add_typer(tokens_app, name="tokens")
jobs_app = typer.Typer(help="Verify and fix jobs on a running `remedy serve` (--server URL).", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
rules_app = typer.Typer(help="Review mined rules: list, show, accept, reject.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")
programs_app = typer.Typer(help="Diagnoser program versions made by `remedy optimize`.", no_args_is_help=True)
app.add_typer(programs_app, name="programs")
lm_app = typer.Typer(
    help="A small local language model for the llm diagnoser (needs the local-lm extra).", no_args_is_help=True
)
app.add_typer(lm_app, name="lm")

# Every command is registered here, in one place and one style: (group, name, function).
_COMMANDS: list[tuple[typer.Typer, str, Callable[..., Any]]] = [
    (kb_app, "init", kb.kb_init),
    (kb_app, "stats", kb.kb_stats),
    (kb_app, "schema", kb.kb_schema),
    (kb_app, "reindex", kb.kb_reindex),
    (kb_app, "import", kb.kb_import),
    (kb_app, "export", kb.kb_export),
    (app, "query", kb.query),
    (app, "similar", kb.similar),
    (case_app, "show", kb.case_show),
    (case_app, "similar", kb.case_similar),
    (app, "signature", signature.signature_command),
    (app, "adopt", adopt.adopt_cmd),
    (patch_app, "check", patch.check),
    (app, "verify", verify.verify),
    (app, "diagnose", diagnose.diagnose),
    (app, "fix", diagnose.fix_cmd),
    (bench_app, "build", bench.build_cmd),
    (bench_app, "factory", factory.factory_cmd),
    (bench_app, "run", bench.bench_run),
    (bench_app, "curve", bench.bench_curve),
    (app, "demo", diagnose.demo_cmd),
    (app, "doctor", doctor.doctor_cmd),
    (app, "report", report.report),
    (app, "serve", serve.serve),
    (tokens_app, "create", tokens.tokens_create),
    (tokens_app, "list", tokens.tokens_list),
    (tokens_app, "revoke", tokens.tokens_revoke),
    (jobs_app, "list", jobs.jobs_list),
    (jobs_app, "show", jobs.jobs_show),
    (jobs_app, "cancel", jobs.jobs_cancel),
    (app, "mine", rules.mine_cmd),
    (rules_app, "list", rules.rules_list),
    (rules_app, "show", rules.rules_show),
    (rules_app, "accept", rules.rules_accept),
    (rules_app, "reject", rules.rules_reject),
    (app, "optimize", optimize.optimize),
    (programs_app, "list", optimize.programs_list),
    (programs_app, "show", optimize.programs_show),
    (programs_app, "activate", optimize.programs_activate),
    (programs_app, "rollback", optimize.programs_rollback),
    (lm_app, "serve", lm.lm_serve),
    (lm_app, "models", lm.lm_models),
]
for _group, _name, _func in _COMMANDS:
    _group.command(_name)(_func)

_err = Console(stderr=True)
#: usage errors from typer's vendored click and from click itself (plug-ins may use either)
_USAGE_ERRORS = (TyperException, click.ClickException)


@runtime_checkable
class _ShownError(Protocol):
    """What both clicks' usage errors offer: ``show()`` prints the usage line and the problem."""

    exit_code: int

    def show(self) -> None: ...


def main() -> None:
    """Entry point of the ``remedy`` console script.

    Maps what a user can cause to a short message and an exit status, never a traceback:
    a :class:`RemedyError` is one red line (exit 1); a usage error (bad option value, missing
    argument) is the usage line and the problem (exit 2). Anything else is a bug and keeps its
    traceback.
    """
    offline_defaults()
    try:
        code = app(standalone_mode=False)  # a command's typer.Exit(n) comes back as n here
    except RemedyError as err:
        _err.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except (typer.Exit, click.exceptions.Exit) as ex:
        sys.exit(ex.exit_code)
    except (typer.Abort, click.exceptions.Abort, KeyboardInterrupt):
        _err.print("[red]aborted[/]")
        sys.exit(130)
    except _USAGE_ERRORS as ex:
        # typer raises its own vendored click's exceptions, not click's, so both are listed.
        if not isinstance(ex, _ShownError):
            raise
        ex.show()
        sys.exit(ex.exit_code)
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
