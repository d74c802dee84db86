"""inspect_ai's stateful tools in the `hull` sandbox, driven by a scripted
model (mockllm's custom outputs: tool calls, then an answer): text_editor
creates and views a file, bash_session keeps a shell whose variables and
working directory last from one call to the next, and git commits, diffs
and stashes in the sample's workspace. Prints one JSON
document: the log's status and each tool call's result.

    python inspect_tools.py TIER LOG_DIR
"""

import json
import sys

from inspect_ai import Task, eval, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash_session, text_editor

TIER, LOG_DIR = sys.argv[1], sys.argv[2]
M = "mockllm/model"
CALLS = [
    ("text_editor", {"command": "create", "path": "/tmp/hello.txt", "file_text": "hello from the editor\n"}),
    ("text_editor", {"command": "str_replace", "path": "/tmp/hello.txt", "old_str": "editor", "new_str": "hull"}),
    ("bash_session", {"action": "type_submit", "input": "cd /tmp && export MARK=kept && cat hello.txt"}),
    ("bash_session", {"action": "type_submit", "input": "echo \"$MARK in $(pwd)\""}),
    # Back in the sample's workspace (hull's copy): git works there. Its
    # output comes at once at the end (bash_session returns half a second
    # after output stops: git under TCG can pause longer).
    ("bash_session", {"action": "type_submit", "input": (
        "cd - >/dev/null && { git init -q && echo one > f.txt && git add f.txt"
        " && git -c user.name=agent -c user.email=agent@example.invalid commit -qm first"
        " && echo two >> f.txt && git diff --stat | tail -1 && git stash -q"
        " && echo \"stashed $(git stash list | wc -l)\" && git --no-pager log --format=%s;"
        " } > /tmp/git.out 2>&1; cat /tmp/git.out"
    )}),
]


@task
def tools():
    return Task(
        dataset=[Sample(id="t", input="use the tools")],
        solver=[use_tools([bash_session(), text_editor()]), generate()],
        sandbox=("hull", {"tier": TIER}),
    )


outputs = [ModelOutput.for_tool_call(M, name, args) for name, args in CALLS]
outputs.append(ModelOutput.from_content(M, "done"))
for o in outputs:
    # Given, so that mockllm counts no tokens (its tokenizer would be
    # downloaded: tests talk to loopback only).
    o.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
model = get_model(M, custom_outputs=outputs)
log = eval(tools(), model=model, log_dir=LOG_DIR, display="none")[0]
sample = log.samples[0] if log.samples else None
results = []
if sample is not None:
    for m in sample.messages:
        if m.role == "tool":
            results.append({"tool": m.function, "error": m.error.message if m.error else None, "text": m.text})
print(json.dumps({"status": log.status, "error": str(log.error) if log.error else None, "results": results}))
