"""Node test cases that metadef is known to fail, each with its reason.

The conformance test requires every case of every supported op to pass or be listed here.
Keep the reasons honest and specific; remove an entry as soon as the case passes.
"""

KNOWN_FAILURES: dict[str, str] = {}
