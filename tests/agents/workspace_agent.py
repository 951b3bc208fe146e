"""A scripted agent program for the workspace tests (no model): it runs the task's reference solution
(``AGENTRL_TASK``'s ``task.solution``) with bash in ``AGENTRL_WORKDIR``, or with ``plant`` as its argument
replaces each collected file with a symlink to a host file, and reports where it ran."""

import json
import os
import subprocess
import sys

task = json.loads(os.environ["AGENTRL_TASK"])["task"]
workdir = os.environ["AGENTRL_WORKDIR"]
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
