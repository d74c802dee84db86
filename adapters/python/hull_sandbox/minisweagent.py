"""hull as a mini-swe-agent environment: `HullEnvironment(project=..., tier=...)`
wherever mini-swe-agent takes an environment (its `Environment` protocol:
`execute`, `get_template_vars`, `serialize`), or by class name in a config:
`environment_class: hull_sandbox.minisweagent.HullEnvironment`. Without
`project`, the current directory is the project, as mini-swe-agent's local
environment works there.

`get_template_vars()` gives what its docker and local environments give,
the stock configs' `system`, `node`, `release`, `version` and `machine`
among them: those of where the commands run (`uname`, asked once in the
session; the guest's kernel on tier 3).

Each action's command runs as `sh -c` in one hull session on the project
(one `hull run` each, with the whole boundary of the tier; stderr merged
into the output, as mini-swe-agent's own environments do). The
environment starts a `hull serve` of its own unless `socket` names one;
`cleanup()` (also on garbage collection) closes the session and stops it.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

from .client import Client, HullError, Server


class HullEnvironmentConfig(BaseModel):
    project: str = ""
    """The project directory the session works in; the current directory
    when not given."""
    tier: str = "bwrap"
    policy: str = "default"
    workspace: str = "shared"
    """shared: the commands write into the project; cow: into a change set
    (`hull changes show ID`), the project untouched."""
    cwd: str = ""
    """A directory inside the project the commands start in."""
    env: dict[str, str] = {}
    timeout: int = 30
    hull: str | None = None
    socket: str | None = None


class HullEnvironment:
    def __init__(self, *, config_class: type = HullEnvironmentConfig, **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        self.config.project = os.path.abspath(self.config.project or os.getcwd())
        self._platform: dict[str, str] | None = None
        self._server = None if self.config.socket else Server(self.config.hull)
        self._client = Client(self.config.socket or self._server.socket_path)
        try:
            info = self._client.create(
                self.config.tier, self.config.project, self.config.policy, self.config.workspace
            )
        except BaseException:
            self._stop_server()
            raise
        self.session = info["id"]

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Runs the action's command; its output (stdout and stderr) and exit code."""
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        try:
            r = self._client.exec(
                self.session,
                ["sh", "-c", "exec 2>&1\n" + command],
                cwd=cwd or self.config.cwd or None,
                env=self.config.env or None,
                timeout=f"{limit}s",
            )
        except HullError as e:
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": "HullError", "exception": str(e)},
            }
            self._check_finished(output)
            return output
        if r["status"] == "timeout":
            output = {
                "output": r.get("stdout", ""),
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: "
                f"the command ran out of its {limit} s",
                "extra": {"exception_type": "TimeoutExpired", "exception": f"timeout {limit} s"},
            }
        elif r["status"] == "hull_error":
            output = {
                "output": r.get("stdout", ""),
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {r.get('error', '')}",
                "extra": {"exception_type": "HullError", "exception": r.get("error", "")},
            }
        else:
            code = r.get("exit_code")
            if code is None:
                code = 128 + int(r.get("signal") or 0)
            output = {"output": r.get("stdout", ""), "returncode": code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        """Raises Submitted when the output says the task is done (as
        mini-swe-agent's own environments do)."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(
            self.config.model_dump(), self._uname(), {"session": self.session}, kwargs
        )

    def _uname(self) -> dict[str, str]:
        """`platform.uname()`'s fields as the session sees them, asked once.
        When the session cannot say (no `uname` in its policy's paths), the
        host's, which native tiers share."""
        if self._platform is None:
            fields = ("system", "node", "release", "version", "machine")
            flags = ("-s", "-n", "-r", "-v", "-m")
            script = "; ".join(f"uname {f}" for f in flags)
            try:
                r = self._client.exec(self.session, ["sh", "-c", script], timeout="30s")
                lines = r.get("stdout", "").splitlines()
                ok = r.get("status") == "exit" and r.get("exit_code") == 0 and len(lines) == 5
            except HullError:
                ok, lines = False, []
            if ok:
                self._platform = dict(zip(fields, lines))
            else:
                u = platform.uname()
                self._platform = {f: getattr(u, f) for f in fields}
        return self._platform

    def serialize(self) -> dict:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }

    def cleanup(self) -> None:
        """Closes the session and stops the server this environment started."""
        session, self.session = getattr(self, "session", None), None
        if session is not None:
            try:
                self._client.close(session)
            except (HullError, OSError):
                pass
        self._stop_server()

    def _stop_server(self) -> None:
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            server.stop()

    def __del__(self) -> None:
        self.cleanup()
