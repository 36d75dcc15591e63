"""`python -I -m gate ...`: NodeGate's command line without a console script.

The operator starts the agent in stage, interrupt and prepull pods this way (`gate.controller.pods`):
the interpreter's isolated mode ignores every PYTHON* variable, the user's site directory and the
current directory, so a gate's env or config cannot put code in front of NodeGate's. The image's
`nodegate` console script is the same entry point, for the webhook and the operator.
"""

import sys

from gate.cli.main import main

if __name__ == "__main__":  # imported by name (gate.kube.imagecheck walks every module), it runs nothing
    sys.exit(main())
