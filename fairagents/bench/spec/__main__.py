"""``python -m fairagents.bench.spec``: print the JSON schema of scenario files (``docs/scenario.schema.json``).

Examples:
    >>> import json, subprocess, sys
    >>> out = subprocess.run([sys.executable, "-m", "fairagents.bench.spec"], capture_output=True, text=True).stdout
    >>> json.loads(out)["title"]
    'Scenario'
"""

from __future__ import annotations

import json

from fairagents.bench.spec import scenario_json_schema

if __name__ == "__main__":
    print(json.dumps(scenario_json_schema(), indent=2))
