"""hull as an inspect_ai sandbox environment: `sandbox="hull"` or
`sandbox=("hull", {"tier": "vm", "policy": "build"})`.

Registered through inspect_ai's entry point (`[project.entry-points.inspect_ai]`
in pyproject.toml): installing this package is all it takes. Each sample
gets one hull session with a workspace of its own: hull's copy of `project`
(or an empty directory), where git works, removed with the session; every
`exec` runs inside the session's sandbox, with the whole boundary of the
tier. The task starts one
`hull serve` of its own (unless `socket` names a running one) and stops
it at the end, which closes whatever session is left.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from typing import Any, Literal, Union, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandboxenv,
)
from inspect_ai.util._sandbox.environment import SandboxUserUnsupportedError
from pydantic import BaseModel

from .client import Client, HullError, Server


class HullSandboxConfig(BaseModel, frozen=True):
    """The `hull` sandbox's configuration."""

    tier: str = "bwrap"
    """landlock, bwrap or vm."""
    policy: str = "default"
    """A shipped profile name (default, readonly, build) or a policy file."""
    project: str | None = None
    """A directory copied into each sample's workspace (default: empty), or,
    with `workspace="cow"`, the project each sample sees through a
    copy-on-write view of its own."""
    workspace: Literal["copy", "cow"] = "copy"
    """copy: each sample a fresh directory (filled from `project`); cow: each
    sample a copy-on-write session on `project` itself (nothing copied; its
    writes kept as a change set, `hull changes show ID`)."""
    hull: str | None = None
    """The hull executable (default: $HULL_BIN, else `hull` on PATH)."""
    socket: str | None = None
    """A running `hull serve`'s socket (default: one started for the task)."""


def _config(config: SandboxEnvironmentConfigType | None) -> HullSandboxConfig:
    if isinstance(config, HullSandboxConfig):
        return config
    if isinstance(config, dict):
        return HullSandboxConfig(**config)
    if config is None:
        return HullSandboxConfig()
    raise ValueError(f"hull: a config of type {type(config).__name__} is not one of hull's")


_lock = threading.Lock()


@atexit.register
def _stop_servers() -> None:
    """The last resort: a server left by a task that did not clean up."""
    while HullSandboxEnvironment._servers:
        _, server = HullSandboxEnvironment._servers.popitem()
        server.stop()


@sandboxenv(name="hull")
class HullSandboxEnvironment(SandboxEnvironment):
    """One sample's hull session and workspace."""

    # One `hull serve` per task (it serves any tier and policy).
    _servers: dict[str, Server] = {}

    def __init__(
        self, client: Client, session: str, workspace: str | None, tier: str = ""
    ) -> None:
        super().__init__()
        self._client = client
        self._session = session
        self.workspace = workspace
        # vm: any user of the container; the process tiers: the session's one.
        self._tier = tier
        # The one user every command of the session runs as, once asked.
        self._user: str | None = None

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return HullSandboxConfig(**config)

    @classmethod
    def _client_for(cls, task_name: str, config: HullSandboxConfig) -> Client:
        if config.socket:
            return Client(config.socket)
        with _lock:
            server = cls._servers.get(task_name)
            if server is None:
                server = Server(config.hull)
                cls._servers[task_name] = server
        return Client(server.socket_path)

    @classmethod
    async def task_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None
    ) -> None:
        c = _config(config)
        await asyncio.to_thread(cls._client_for, task_name, c)

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        c = _config(config)
        client = await asyncio.to_thread(cls._client_for, task_name, c)
        if c.workspace == "cow":
            if not c.project:
                raise ValueError('hull: workspace "cow" needs a project')
            info = await asyncio.to_thread(
                client.create, c.tier, os.path.abspath(c.project), c.policy, "cow"
            )
            return {"default": cls(client, info["id"], None, c.tier)}
        # hull's own copy of the project (or an empty directory): the
        # sample's, removed when its session closes; git works there.
        project = os.path.abspath(c.project) if c.project else None
        info = await asyncio.to_thread(client.create, c.tier, project, c.policy, "copy")
        return {"default": cls(client, info["id"], info["project"], c.tier)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            sandbox = env.as_type(HullSandboxEnvironment)
            try:
                await asyncio.to_thread(sandbox._client.close, sandbox._session)
            except HullError as e:
                if e.status != 404:
                    raise

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        with _lock:
            server = cls._servers.pop(task_name, None)
        if server is not None:
            await asyncio.to_thread(server.stop)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        await asyncio.to_thread(_stop_servers)

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        # vm: any user of the container, `root` included.
        if self._tier != "vm" and user is not None and user != await self._session_user():
            raise SandboxUserUnsupportedError(
                f"hull: user {user!r}: every command of this session runs as "
                f"{self._user!r} (the caller, or hull's sandbox user when hull is root)"
            )
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        r = await asyncio.to_thread(
            self._client.exec,
            self._session,
            cmd,
            cwd=cwd,
            env=env,
            stdin=input,
            timeout=f"{timeout}s" if timeout is not None else None,
            max_output=min(limit, _MAX),
            user=user if self._tier == "vm" else None,
        )
        status = r["status"]
        if status == "timeout":
            raise TimeoutError(f"hull: {cmd[0]} ran out of its {timeout} s")
        if status == "hull_error":
            raise RuntimeError(f"hull: the command did not run: {r.get('error', '')}")
        code = r.get("exit_code")
        if code is None:
            code = 128 + int(r.get("signal") or 0)
        if code == 126 and r.get("error") and user is None:
            # The program is there but cannot be executed in the sandbox.
            # (With a user named on vm, 126 is also a user the container
            # does not have: a failed result whose stderr names it, as
            # docker's.)
            raise PermissionError(r["error"])
        if r.get("truncated"):
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                truncated_output=r.get("stdout"),
            )
        stderr = r.get("stderr", "")
        if r.get("hint"):
            # hull's word on the failure (a refused write to `.git`): the
            # model reads stderr.
            stderr += f"\nhull: {r['hint']}\n"
        return ExecResult(
            success=code == 0,
            returncode=code,
            stdout=r.get("stdout", ""),
            stderr=stderr,
        )

    async def _session_user(self) -> str:
        if self._user is None:
            r = await asyncio.to_thread(self._client.exec, self._session, ["id", "-un"])
            name = r.get("stdout", "").strip()
            self._user = name if r.get("exit_code") == 0 and name else "?"
        return self._user

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        try:
            await asyncio.to_thread(self._client.write, self._session, file, data)
        except HullError as e:
            raise _os_error(e, file) from e

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        limit_str = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR
        try:
            data = await asyncio.to_thread(
                self._client.read, self._session, file, min(limit, _MAX)
            )
        except HullError as e:
            if e.status == 413:
                raise OutputLimitExceededError(limit_str=limit_str, truncated_output=None) from e
            raise _os_error(e, file) from e
        # Newlines as they are (no universal-newline translation).
        return data.decode("utf-8") if text else data


# What the session API keeps of one stream, and reads of one file.
_MAX = 64 * 1024 * 1024


def _os_error(e: HullError, file: str) -> Exception:
    if "Is a directory" in e.message:
        return IsADirectoryError(e.message)
    if e.status == 404:
        return FileNotFoundError(e.message)
    if e.status == 403:
        return PermissionError(e.message)
    return e
