

from django.core.management.base import BaseCommand, CommandError  # noqa: E402


class LlmgwCommand(BaseCommand):
    """A command of llmgw's own: bad configuration or input is one ``error: …`` line and exit 2, never a
    traceback (``--traceback`` still shows one)."""

    _from_command_line = False
    # Django's own options (--settings, --pythonpath, --traceback …): accepted, not listed in --help, which
    # teaches the command's own.
    DJANGO_OPTIONS = ("--version", "--verbosity", "--settings", "--pythonpath", "--traceback", "--no-color",
                      "--force-color", "--skip-checks")

    def create_parser(self, prog_name, subcommand, **kwargs):
        import argparse

        from llmgw.ctl import parse

        parser = super().create_parser(prog_name, subcommand, **kwargs)
        for action in parser._actions:
            if any(option in self.DJANGO_OPTIONS for option in action.option_strings):
                action.help = argparse.SUPPRESS
        # A command with subcommands (`sim up`, `sim facility`): an option one does not take is refused with
        # that one's usage (`llmgw sim facility: error: unrecognized arguments: --once`), as ctl does.
        parser.parse_args = lambda args=None, namespace=None: parse(parser, list(args or ()))
        return parser

    def run_from_argv(self, argv):
        self._from_command_line = True  # call_command (tests, other code) still gets the CommandError
        return super().run_from_argv(argv)

    def execute(self, *args, **options):
        from llmgw.errors import LlmgwError

        try:
            return super().execute(*args, **options)
        except (CommandError, LlmgwError) as exc:
            if options.get("traceback") or not self._from_command_line:
                raise
            message = exc.message if isinstance(exc, LlmgwError) else str(exc)
            self.stderr.write(f"error: {message}", style_func=lambda text: text)
            raise SystemExit(2) from None
