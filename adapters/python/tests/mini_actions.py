"""mini-swe-agent's environment protocol on hull, no model: a scripted
list of actions, as its agent would send them, through
`hull_sandbox.minisweagent.HullEnvironment`. Prints one JSON document: each
action's output, and the submission the last one makes.

    python mini_actions.py TIER PROJECT
"""

import json
import sys

from minisweagent.exceptions import Submitted

from hull_sandbox.minisweagent import HullEnvironment

TIER, PROJECT = sys.argv[1], sys.argv[2]

env = HullEnvironment(project=PROJECT, tier=TIER, timeout=20)
results = []
submission = None
try:
    for command in [
        "echo hello",
        "printf 'made by the agent\\n' > notes.txt && cat notes.txt",
        "echo to-stderr >&2; exit 3",
        "cd sub && pwd",
        "sleep 30",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the fix",
    ]:
        try:
            results.append(env.execute({"command": command}, timeout=2 if command.startswith("sleep") else None))
        except Submitted as s:
            submission = s.messages[0]["content"] if hasattr(s, "messages") else str(s.args[0])
    print(
        json.dumps(
            {
                "results": results,
                "submission": submission,
                "vars": sorted(env.get_template_vars().keys()),
                "serialized": env.serialize(),
            }
        )
    )
finally:
    env.cleanup()
