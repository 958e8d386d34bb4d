

from django.core.management.base import BaseCommand, CommandError  # noqa: E402


class LlmgwCommand(BaseCommand):
    """A command of llmgw's own: bad configuration or input is one ``error: …`` line and exit 2, never a
    traceback (``--traceback`` still shows one)."""

    _from_command_line = False

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
