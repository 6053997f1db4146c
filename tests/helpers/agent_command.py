"""An agent program run as a command (``program: [python, tests/helpers/agent_command.py]``): the row on stdin,
the endpoint in OPENAI_BASE_URL and OPENAI_API_KEY, the answer on stdout, as any script would do it.
``fail`` in the row's ground truth makes it exit 4."""

import json
import sys

import openai

row = json.load(sys.stdin)
if row["ground_truth"] == "fail":
    print("cannot go on", file=sys.stderr)
    sys.exit(4)
client = openai.OpenAI(max_retries=0)
reply = client.chat.completions.create(model="rlx-policy", messages=row["prompt"], max_tokens=3)
print(json.dumps({"answer": reply.choices[0].message.content}))
