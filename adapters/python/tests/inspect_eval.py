"""An inspect_ai eval of two samples in the `hull` sandbox, no model
needed (mockllm; the solver and scorer only use the sandbox). Each sample
writes its input into its workspace and an answer made from it, and tries
to write VICTIM, a file outside its roots; the scorer reads the answer in
the sandbox. Prints one JSON document: the log's status and, per sample,
its score, answer, the attack's exit code and what its workspace held.

    python inspect_eval.py TIER VICTIM LOG_DIR [COW_PROJECT]

With COW_PROJECT each sample is a copy-on-write session on that project
(`workspace="cow"`) instead of a fresh directory.
"""

import json
import sys

from inspect_ai import Task, eval, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, accuracy, scorer
from inspect_ai.solver import solver
from inspect_ai.util import sandbox

TIER, VICTIM, LOG_DIR = sys.argv[1], sys.argv[2], sys.argv[3]
CONFIG = {"tier": TIER}
if len(sys.argv) > 4:
    CONFIG.update(workspace="cow", project=sys.argv[4])


@solver
def upcase():
    async def solve(state, generate):
        sb = sandbox()
        await sb.write_file("input.txt", state.input_text)
        await sb.exec(["sh", "-c", "tr a-z A-Z < input.txt > answer.txt"])
        attack = await sb.exec(["sh", "-c", f"echo pwned > '{VICTIM}'"])
        state.metadata["attack_exit"] = attack.returncode
        state.metadata["seen"] = (await sb.exec(["ls"])).stdout.split()
        return state

    return solve


@scorer(metrics=[accuracy()])
def answer_is_upper():
    async def score(state, target):
        r = await sandbox().exec(["cat", "answer.txt"])
        got = r.stdout.strip()
        return Score(value=CORRECT if r.success and got == target.text else INCORRECT, answer=got)

    return score


@task
def two_samples():
    return Task(
        dataset=[
            Sample(id="s1", input="abc", target="ABC"),
            Sample(id="s2", input="hull", target="HULL"),
        ],
        solver=upcase(),
        scorer=answer_is_upper(),
        sandbox=("hull", CONFIG),
    )


log = eval(two_samples(), model="mockllm/model", log_dir=LOG_DIR, display="none")[0]
print(
    json.dumps(
        {
            "status": log.status,
            "error": str(log.error) if log.error else None,
            "samples": [
                {
                    "id": s.id,
                    "score": s.scores["answer_is_upper"].value if s.scores else None,
                    "answer": s.scores["answer_is_upper"].answer if s.scores else None,
                    "attack_exit": s.metadata.get("attack_exit"),
                    "seen": s.metadata.get("seen"),
                    "error": str(s.error) if s.error else None,
                }
                for s in (log.samples or [])
            ],
        }
    )
)
