# checks/validate_api_responses.py
import json
import sys

ctx = json.load(sys.stdin)
audit_path = ctx["audit_log_path"]
valid = 0
total = 0
for line in open(audit_path):
    event = json.loads(line)
    if event["type"] != "http_call":
        continue
    total += 1
    response = event["details"].get("response_body", "")
    try:
        data = json.loads(response)
        if "id" in data and "status" in data:
            valid += 1
    except json.JSONDecodeError:
        pass
passed = total > 0 and valid == total
print(
    json.dumps(
        {
            "passed": passed,
            "score": valid / total if total else 0,
            "reason": f"{valid}/{total} responses valid",
        }
    )
)
