"""inspect_ai's own conformance suite for sandbox providers
(`inspect_ai.util._sandbox.self_check`, plain async checks meant for
pytest) run against the `hull` sandbox: each check on a fresh sample
sandbox (or all on one, `--one-sandbox`, as a long sample would use it).
Prints one JSON document: each check's name and "pass", or why it failed.

    python inspect_self_check.py TIER [--one-sandbox]
"""

import asyncio
import inspect as pyinspect
import json
import sys

from inspect_ai.util._sandbox import self_check

from hull_sandbox.inspect import HullSandboxEnvironment

TIER = sys.argv[1]
ONE = "--one-sandbox" in sys.argv[2:]


async def main():
    config = {"tier": TIER}
    await HullSandboxEnvironment.task_init("self_check", config)
    results = {}
    shared = None
    try:
        if ONE:
            shared = await HullSandboxEnvironment.sample_init("self_check", config, {})
        for name, check in sorted(vars(self_check).items()):
            if not name.startswith("test_") or not pyinspect.iscoroutinefunction(check):
                continue
            envs = shared or await HullSandboxEnvironment.sample_init("self_check", config, {})
            try:
                await check(envs["default"])
                results[name] = "pass"
            except BaseException as e:  # noqa: BLE001 - a check's failure, reported
                results[name] = f"{type(e).__name__}: {e}"[:500]
            finally:
                if not ONE:
                    await HullSandboxEnvironment.sample_cleanup("self_check", config, envs, False)
        # hull's own: the session's one user is accepted by name; another
        # is refused naming it (the process tiers), or is any user of the
        # container, one it does not have a failed exec naming it (vm).
        envs = shared or await HullSandboxEnvironment.sample_init("self_check", config, {})
        try:
            sandbox = envs["default"]
            me = (await sandbox.exec(["id", "-un"])).stdout.strip()
            r = await sandbox.exec(["id", "-un"], user=me)
            results["hull_exec_as_the_session_s_user"] = (
                "pass" if r.success and r.stdout.strip() == me else f"got {r}"
            )
            if TIER == "vm":
                r = await sandbox.exec(["id", "-un"], user="root")
                results["hull_exec_as_root_of_the_container"] = (
                    "pass" if r.success and r.stdout.strip() == "root" else f"got {r}"
                )
            try:
                r = await sandbox.exec(["true"], user="someone-else")
                # vm: a failed result (126) whose stderr names the user.
                ok = TIER == "vm" and not r.success and "someone-else" in r.stderr
                results["hull_exec_as_another_user_is_refused"] = (
                    "pass" if ok else f"ran: {r}"
                )
            except Exception as e:  # noqa: BLE001 - the refusal, reported
                ok = TIER != "vm" and "someone-else" in str(e) and me in str(e)
                results["hull_exec_as_another_user_is_refused"] = (
                    "pass" if ok else f"{type(e).__name__}: {e}"
                )
        finally:
            await HullSandboxEnvironment.sample_cleanup("self_check", config, envs, False)
    finally:
        await HullSandboxEnvironment.task_cleanup("self_check", config, True)
    print(json.dumps(results))


asyncio.run(main())
