#!/usr/bin/env python3
"""A test agent written from seed 004 (cleveragents' `implementation-worker` v2).

The stub model server runs it through opencode's bash tool: argv[1] is the file
holding the prompt the model received, argv[2] a folder for the trace this agent
leaves for the test (`trace-<work_type>-<work_number>.json`, `dispatch-…md`).

What it does, step by step as 004 says (section names are 004's):

- Startup 1: parse and validate the prompt's parameter lines (`key: value` before the
  first `## ` heading; quotes and backticks around a value are dropped, as 004's
  example quotes them).
- Startup 2: `## Worker credentials (use these instead of env vars)` present → its
  values are authoritative and `printenv` is not called for them; absent →
  `printenv FORGEJO_PAT` / `GIT_USER_NAME` / `GIT_USER_EMAIL` (004's only allowed
  form); `forgejo_url` / `_owner` / `_repo` from `FORGEJO_*` or `git remote get-url
  origin`.
- Startup 3: explicit vs fetched variables are tracked; only explicit ones go
  downstream.
- Startup 4: a required parameter still missing or malformed → report and exit
  immediately, exit status 0 (opencode ends the session normally: 004's worker says
  why in its last message and stops).
- Startup 5/6: `pr_fix` → claim `auto/claimed-implementer` through Forgejo's label API
  (v15: `GET /repos/{o}/{r}/labels`, `GET /repos/{o}/{r}/pulls/{n}`,
  `POST /repos/{o}/{r}/issues/{n}/labels`) with `forgejo_pat`; not provisioned, PR
  not open, or an HTTP error → report and exit. `issue_impl` → no claim.
- Main task 1: `task_prompt` = the explicit parameter lines, then every `##` section
  exactly as received, in order (fences untouched, the standing line included);
  the 80 % length check of the CRITICAL RULE before dispatching.
- Main task 2: the dispatcher call (004's template: top-level explicit lines,
  `task_agent`, `estimator_agent`, `escalation_tier_hint` only when the prompt had it)
  is written to `dispatch-…md`; the "task-implementor" below it is played here and
  reads ONLY `task_prompt`, so a dropped section would starve it: `pr_fix` reads the
  failing test from `## Pre-fetched CI per-check detail`, commits a fix in the
  `## Pre-cloned working copy` and pushes the PR branch; `issue_impl` commits on a
  new branch, pushes it and opens the PR (`POST /repos/{o}/{r}/pulls`, body
  `Closes #N`).
- Release and Exit: no release when `release_claim_on_exit: false`, else
  `DELETE /repos/{o}/{r}/issues/{n}/labels/{id}`; then the dispatcher's output is
  printed verbatim (the model's last message, which the stub echoes).
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

CREDENTIALS = "## Worker credentials (use these instead of env vars)"
REQUIRED = [
    "forgejo_url",
    "forgejo_owner",
    "forgejo_repo",
    "forgejo_pat",
    "git_user_name",
    "git_user_email",
    "work_type",
    "work_number",
    "work_title",
]
# 004: "the prompt minus the few wrapper-only parameter lines".
WRAPPER_ONLY = [
    "work_type",
    "work_number",
    "forgejo_url",
    "forgejo_owner",
    "forgejo_repo",
    "forgejo_pat",
    "git_user_name",
    "git_user_email",
    "release_claim_on_exit",
    "tier_agent",
    "target_agent",
]
# The parameters 004 names; any other line is a pass-through, forwarded verbatim.
KNOWN = REQUIRED + ["escalation_tier_hint", "release_claim_on_exit", "tier_agent", "target_agent"]
CLAIM_LABEL = "auto/claimed-implementer"
USER_AGENT = "v2-worker-test/1"


def unquote(v):
    v = v.strip()
    for q in ('"', "`", "'"):
        if len(v) >= 2 and v.startswith(q) and v.endswith(q):
            return v[1:-1]
    return v


def parse(text):
    """Parameter lines, wrapper-only bytes, and the `##` sections outside fences."""
    params, wrapper_bytes, sections = {}, 0, []
    fence = None
    for line in text.splitlines(keepends=True):
        bare = line.rstrip("\n")
        ticks = len(bare) - len(bare.lstrip("`"))
        opened = False
        if fence is not None:
            if ticks >= fence and bare.strip() == "`" * ticks:
                fence = None
        elif ticks >= 3:
            fence, opened = ticks, True
        if fence is None and not opened and bare.startswith("## "):
            sections.append([bare, line])
            continue
        if not sections:
            m = re.match(r"^([a-z_]+): ?(.*)$", bare)
            if m:
                params[m.group(1)] = unquote(m.group(2))
                if m.group(1) not in KNOWN:
                    params.setdefault("_passthrough", "")
                    params["_passthrough"] += line
                if m.group(1) in WRAPPER_ONLY:
                    wrapper_bytes += len(line.encode())
            continue
        sections[-1][1] += line
    return params, wrapper_bytes, sections


def section(sections, heading):
    for h, text in sections:
        if h == heading:
            return text
    return None


def printenv(name, trace):
    trace["printenv"].append(name)
    out = subprocess.run(["printenv", name], capture_output=True, text=True)
    return out.stdout.strip() or None


def fail(trace, out_dir, message):
    trace["exit"] = message
    save(trace, out_dir)
    print(f"implementation-worker: {message}")
    sys.exit(0)


def save(trace, out_dir):
    name = f"trace-{trace.get('work_type', 'unknown')}-{trace.get('work_number', 'unknown')}.json"
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(trace, f, indent=1)


def api(v, method, path, body=None, trace=None):
    url = v["forgejo_url"].rstrip("/") + "/api/v1" + path
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", "token " + v["forgejo_pat"])
    req.add_header("User-Agent", USER_AGENT)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode(errors="replace")
    if trace is not None:
        trace["calls"].append([method, path, status])
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def git(cwd, *args):
    out = subprocess.run(
        ["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"git {args}: {out.stderr.strip()}")
    return out.stdout.strip()


def claim(v, trace):
    """claim_pr.ts --action claim: the label must be provisioned, the PR open; adding a
    label it already has is a no-op (idempotent)."""
    o, r, n = v["forgejo_owner"], v["forgejo_repo"], v["work_number"]
    status, labels = api(v, "GET", f"/repos/{o}/{r}/labels?limit=50", trace=trace)
    if status != 200:
        return f"cannot list labels: HTTP {status}"
    ids = [l["id"] for l in labels if l.get("name") == CLAIM_LABEL]
    if not ids:
        return f"label {CLAIM_LABEL} not provisioned"
    status, pr = api(v, "GET", f"/repos/{o}/{r}/pulls/{n}", trace=trace)
    if status != 200 or pr.get("state") != "open":
        return f"PR #{n} is not open (HTTP {status})"
    status, _ = api(
        v, "POST", f"/repos/{o}/{r}/issues/{n}/labels", {"labels": [ids[0]]}, trace
    )
    if status != 200:
        return f"claim failed: HTTP {status}"
    trace["claim_label_id"] = ids[0]
    return None


def checkout_path(task_params, task_sections):
    text = section(task_sections, "## Pre-cloned working copy") or ""
    first = text.split("\n", 2)[1] if "\n" in text else ""
    if not first.startswith("/"):
        return None
    return first.split(" (on the head branch")[0].strip()


def commit_all(cwd, task_params, message):
    name = task_params.get("git_user_name") or git(cwd, "config", "user.name")
    email = task_params.get("git_user_email") or git(cwd, "config", "user.email")
    git(cwd, "add", "-A")
    git(cwd, "-c", f"user.name={name}", "-c", f"user.email={email}", "commit", "-qm", message)
    return git(cwd, "rev-parse", "HEAD")


def task_implementor(task_prompt, v, trace):
    """The task agent four hops down: reads nothing but `task_prompt`."""
    p, _, sections = parse(task_prompt)
    trace["task_headings"] = [h for h, _ in sections]
    work = checkout_path(p, sections)
    if work is None:
        return "task-implementor: no pre-cloned working copy in the task prompt"
    n = p["work_number"]
    if p["work_type"] == "pr_fix":
        detail = section(sections, "## Pre-fetched CI per-check detail") or ""
        failed = re.findall(r"^test (\S+) \.\.\. FAILED$", detail, re.M)
        trace["failing_tests_seen"] = failed
        if not failed:
            return "task-implementor: no failing test in the CI per-check detail; nothing to fix"
        os.makedirs(os.path.join(work, "fixes"), exist_ok=True)
        for t in failed:
            with open(os.path.join(work, "fixes", t + ".txt"), "w") as f:
                f.write(f"{t} handles the empty input\n")
        sha = commit_all(work, p, f"Fix {', '.join(failed)} (PR #{n})")
        git(work, "push", "-q", "origin", "HEAD")
        trace["pushed"] = sha
        return f"task-implementor: fixed {', '.join(failed)}; pushed {sha} to the PR branch"
    branch = f"implementer/issue-{n}"
    git(work, "checkout", "-q", "-b", branch)
    with open(os.path.join(work, f"issue-{n}.txt"), "w") as f:
        f.write(p["work_title"] + "\n")
    sha = commit_all(work, p, f"Implement #{n}: {p['work_title']}")
    git(work, "push", "-q", "origin", f"HEAD:refs/heads/{branch}")
    trace["pushed"] = sha
    o, r = p["forgejo_owner"], p["forgejo_repo"]
    # Forgejo learns a pushed branch asynchronously: wait for it (bounded).
    for _ in range(600):
        status, b = api(v, "GET", f"/repos/{o}/{r}/branches/{branch}")
        if status == 200 and b.get("commit", {}).get("id") == sha:
            break
        time.sleep(0.1)
    else:
        return f"task-implementor: pushed {sha} but Forgejo never showed {branch}"
    _, repo = api(v, "GET", f"/repos/{o}/{r}", trace=trace)
    body = {
        "head": branch,
        "base": repo["default_branch"],
        "title": p["work_title"],
        "body": f"Implements #{n}.\n\nCloses #{n}\n",
    }
    status, pr = api(v, "POST", f"/repos/{o}/{r}/pulls", body, trace)
    if status != 201:
        return f"task-implementor: opening the PR failed: HTTP {status} {pr}"
    trace["opened_pr"] = pr["number"]
    return f"task-implementor: opened PR #{pr['number']} from {branch} at {sha} (Closes #{n})"


def main():
    prompt_file, out_dir = sys.argv[1], sys.argv[2]
    with open(prompt_file) as f:
        prompt = f.read()
    params, wrapper_bytes, sections = parse(prompt)
    trace = {
        "params": params,
        "headings": [h for h, _ in sections],
        "printenv": [],
        "calls": [],
        "explicit": [],
        "fetched": [],
        "work_type": params.get("work_type"),
        "work_number": params.get("work_number"),
    }
    # Startup 2: the credentials section is authoritative; else the env fallback.
    v = {k: params[k] for k in REQUIRED if params.get(k)}
    creds = section(sections, CREDENTIALS)
    trace["credentials_section"] = creds is not None
    if creds is not None:
        cp, _, _ = parse(creds.split("\n", 1)[1] if "\n" in creds else "")
        for k in ("forgejo_pat", "git_user_name", "git_user_email"):
            if cp.get(k):
                v[k] = cp[k]
    else:
        for k, var in (
            ("forgejo_pat", "FORGEJO_PAT"),
            ("git_user_name", "GIT_USER_NAME"),
            ("git_user_email", "GIT_USER_EMAIL"),
        ):
            if k in v:
                continue
            value = printenv(var, trace)
            if value is None:
                fail(trace, out_dir, f"required environment variable {var} is not set")
            v[k] = value
            trace["fetched"].append(k)
    for k, var in (
        ("forgejo_url", "FORGEJO_URL"),
        ("forgejo_owner", "FORGEJO_OWNER"),
        ("forgejo_repo", "FORGEJO_REPO"),
    ):
        if k not in v and os.environ.get(var):
            v[k] = os.environ[var]
            trace["fetched"].append(k)
    trace["explicit"] = [k for k in REQUIRED if k in v and k not in trace["fetched"]]
    # Startup 4: anything still missing or malformed stops the worker here.
    missing = [k for k in REQUIRED if not v.get(k)]
    if missing:
        fail(trace, out_dir, f"missing required parameter(s): {', '.join(missing)}")
    if v["work_type"] not in ("issue_impl", "pr_fix") or not v["work_number"].isdigit():
        fail(trace, out_dir, f"malformed work_type/work_number: {v['work_type']}/{v['work_number']}")
    # Startup 5/6: claim PR work.
    if v["work_type"] == "pr_fix":
        err = claim(v, trace)
        if err:
            fail(trace, out_dir, err)
    # Main task 1: the verbatim task prompt and the length check.
    explicit_lines = "".join(
        f"{k}: {v[k]}\n"
        for k in [
            "forgejo_url",
            "forgejo_owner",
            "forgejo_repo",
            "forgejo_pat",
            "git_user_name",
            "git_user_email",
            "work_type",
            "work_number",
            "work_title",
        ]
        if k in trace["explicit"] and k in params
    )
    forwarded = "".join(text for _, text in sections)
    task_prompt = explicit_lines + params.get("_passthrough", "") + "\n" + forwarded
    base = len(prompt.encode()) - wrapper_bytes
    trace["input_bytes"], trace["task_prompt_bytes"] = len(prompt.encode()), len(task_prompt.encode())
    trace["ratio"] = len(task_prompt.encode()) / max(base, 1)
    if trace["ratio"] < 0.8:
        fail(trace, out_dir, "task_prompt lost more than 20 % of the input: not dispatched")
    # Main task 2: the dispatcher call as 004's template writes it.
    top = "".join(
        f"  {k}: `{v[k]}`\n"
        for k in ["forgejo_url", "forgejo_owner", "forgejo_repo", "forgejo_pat", "git_user_name", "git_user_email"]
        if k in trace["explicit"] and k in params
    )
    top += "  task_agent: `task-implementor`\n  estimator_agent: `estimator-implementation`\n"
    if "escalation_tier_hint" in params:
        top += f"  escalation_tier_hint: `{params['escalation_tier_hint']}`\n"
    call = (
        top
        + "\n  The following is the task prompt you are to use:\n\n"
        + task_prompt
        + "\nDispatch the above task through the appropriate tier selector to the `task-implementor`.\n"
    )
    name = f"dispatch-{v['work_type']}-{v['work_number']}.md"
    with open(os.path.join(out_dir, name), "w") as f:
        f.write(call)
    with open(os.path.join(out_dir, f"task-prompt-{v['work_type']}-{v['work_number']}.md"), "w") as f:
        f.write(task_prompt)
    try:
        output = task_implementor(task_prompt, v, trace)
    except Exception as e:  # the dispatcher failed: still release and exit
        output = f"task-implementor failed: {e}"
    # Release and Exit.
    if v["work_type"] == "pr_fix" and params.get("release_claim_on_exit") != "false":
        o, r, n = v["forgejo_owner"], v["forgejo_repo"], v["work_number"]
        api(v, "DELETE", f"/repos/{o}/{r}/issues/{n}/labels/{trace['claim_label_id']}", trace=trace)
        trace["released"] = True
    trace["output"] = output
    trace["exit"] = "dispatched"
    save(trace, out_dir)
    print(output)


if __name__ == "__main__":
    main()
