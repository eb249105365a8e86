"""``python -m mirrorkit.bench --child SPEC_JSON``: one configuration's process (internal)."""

import sys

from mirrorkit.bench.child import child_main

sys.exit(child_main(sys.argv[1:]))
