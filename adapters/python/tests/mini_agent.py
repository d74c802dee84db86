"""mini-swe-agent's own agent loop on hull, its stock config as shipped
(`default` or `mini`), a scripted model (mini-swe-agent's
`DeterministicModel`) in place of an LLM: the environment made as the
config says, with no project (the current directory is the project).
Prints one JSON document: the loop's result, the rendered system and
instance messages, the first observation, and the environment's template
variables that the stock templates use.

    cd PROJECT && python mini_agent.py TIER CONFIG
"""

import json
import sys

import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_path
from minisweagent.models.test_models import DeterministicModel, make_output

from hull_sandbox.minisweagent import HullEnvironment

TIER, CONFIG = sys.argv[1], sys.argv[2]
config = yaml.safe_load(get_config_path(CONFIG).read_text())


def says(command: str) -> dict:
    return make_output(f"THOUGHT: next.\n\n```mswea_bash_command\n{command}\n```", [{"command": command}])


model = DeterministicModel(
    outputs=[
        says("echo fixed > fix.txt && cat fix.txt && uname -m"),
        says("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the fix"),
    ],
    observation_template=config["model"]["observation_template"],
)
env = HullEnvironment(tier=TIER, timeout=30, **config.get("environment", {}))
try:
    agent = DefaultAgent(model, env, **config["agent"])
    result = agent.run("Write fix.txt.")
    tv = env.get_template_vars()
    print(
        json.dumps(
            {
                "result": result,
                "system": agent.messages[0]["content"],
                "instance": agent.messages[1]["content"],
                "observation": agent.messages[3]["content"],
                "vars": {k: tv[k] for k in ("system", "node", "release", "version", "machine", "project")},
            }
        )
    )
finally:
    env.cleanup()
