"""A scripted agent program for the workspace tests: it runs the task's reference solution
(``AGENTRL_TASK``'s ``task.solution``) with bash in ``AGENTRL_WORKDIR``, or with ``plant`` as its argument
replaces each collected file with a symlink to a host file, and reports where it ran; with ``ask`` it
first asks the endpoint for one completion (the official openai client), as an agent would."""

import json
import os
import subprocess
import sys

task = json.loads(os.environ["AGENTRL_TASK"])["task"]
workdir = os.environ["AGENTRL_WORKDIR"]
if sys.argv[1:] == ["ask"]:
    from openai import OpenAI

    OpenAI().chat.completions.create(
        model="agentrl-policy", messages=json.loads(os.environ["AGENTRL_TASK"])["messages"]
    )
if sys.argv[1:] == ["plant"]:
    for name in task["collect"]:
        path = os.path.join(workdir, name)
        if os.path.lexists(path):
            os.remove(path)
        os.symlink("/etc/hostname", path)
    code = 0
else:
    code = subprocess.run(["bash", "-c", task["solution"]], cwd=workdir).returncode
print(json.dumps({"solution_exit": code, "files": sorted(os.listdir(workdir)), "cwd": os.getcwd(), "workdir": workdir}))
