"""inspect_ai's own conformance suite for sandbox providers
(`inspect_ai.util._sandbox.self_check`, plain async checks meant for
pytest) run against the `hull` sandbox: each check on a fresh sample
sandbox. Prints one JSON document: each check's name and "pass", or why
it failed.

    python inspect_self_check.py TIER
"""

import asyncio
import inspect as pyinspect
import json
import sys

from inspect_ai.util._sandbox import self_check

from hull_sandbox.inspect import HullSandboxEnvironment

TIER = sys.argv[1]


async def main():
    config = {"tier": TIER}
    await HullSandboxEnvironment.task_init("self_check", config)
    results = {}
    try:
        for name, check in sorted(vars(self_check).items()):
            if not name.startswith("test_") or not pyinspect.iscoroutinefunction(check):
                continue
            envs = await HullSandboxEnvironment.sample_init("self_check", config, {})
            try:
                await check(envs["default"])
                results[name] = "pass"
            except BaseException as e:  # noqa: BLE001 - a check's failure, reported
                results[name] = f"{type(e).__name__}: {e}"[:500]
            finally:
                await HullSandboxEnvironment.sample_cleanup("self_check", config, envs, False)
        # hull's own: the session's one user is accepted by name, another
        # is refused naming it.
        envs = await HullSandboxEnvironment.sample_init("self_check", config, {})
        try:
            sandbox = envs["default"]
            me = (await sandbox.exec(["id", "-un"])).stdout.strip()
            r = await sandbox.exec(["id", "-un"], user=me)
            results["hull_exec_as_the_session_s_user"] = (
                "pass" if r.success and r.stdout.strip() == me else f"got {r}"
            )
            try:
                await sandbox.exec(["true"], user="someone-else")
                results["hull_exec_as_another_user_is_refused"] = "ran"
            except Exception as e:  # noqa: BLE001 - the refusal, reported
                ok = "someone-else" in str(e) and me in str(e)
                results["hull_exec_as_another_user_is_refused"] = (
                    "pass" if ok else f"{type(e).__name__}: {e}"
                )
        finally:
            await HullSandboxEnvironment.sample_cleanup("self_check", config, envs, False)
    finally:
        await HullSandboxEnvironment.task_cleanup("self_check", config, True)
    print(json.dumps(results))


asyncio.run(main())
