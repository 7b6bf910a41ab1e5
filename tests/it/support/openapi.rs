//! Forgejo API conformance: every call a test's fake Forgejo saw, and every API path
//! `src/forgejo/` builds, checked against Forgejo v15.0.3's own API definition
//! (`tests/data/forgejo-openapi-v15.json`, Swagger 2.0; provenance in
//! `tests/data/README.md`).
//!
//! For a call: the `/api/v1` base is stripped and method + path are matched against the
//! definition's path templates, one segment per parameter (a literal segment beats a
//! parameter, the first differing segment decides; a template whose path matches but
//! lacks the method gives way to a less specific one that has it, as Forgejo's router
//! chi does; a final `{filepath}`, or the `{branch}` of `…/branches/{branch}`, takes
//! the rest of the path). Then:
//! - the operation exists;
//! - each path parameter is declared and fits its type and enum (e.g. an integer
//!   `{index}`);
//! - each query parameter is declared by the operation (the query form of `sudo`, a
//!   security parameter, is allowed everywhere) and fits its type, format, enum and
//!   minimum (`integer`, `boolean` as Go's `strconv.ParseBool` reads it, `string` with
//!   `date-time`, arrays: `multi` one value per repetition, else comma-separated);
//!   required query parameters are present;
//! - the JSON body against the body parameter's schema (`$ref` followed, `allOf`
//!   merged): every key is a property (matched exactly first, then case-insensitively,
//!   as Go's `encoding/json` decodes; a key the schema lacks is a violation: Go drops it
//!   silently), required keys present, JSON types (null is no type), enums, integer
//!   ranges and RFC 3339 date-times; a body sent to an operation that takes none.
//!
//! The definition is parsed and indexed once per test process ([`spec`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::OnceLock;

use serde_json::{Map, Value};

/// The definition, in the repository (see `tests/data/README.md`).
const SPEC_JSON: &str = include_str!("../../data/forgejo-openapi-v15.json");

/// HTTP methods an operation can have in Swagger 2.0.
const METHODS: [&str; 7] = ["get", "put", "post", "delete", "options", "head", "patch"];

/// The parsed, indexed definition of this process (parsed on first use).
pub fn spec() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(|| {
        Spec::parse(SPEC_JSON).unwrap_or_else(|e| {
            panic!("tests/data/forgejo-openapi-v15.json is not a usable definition: {e}")
        })
    })
}

/// One part of a path template's segment.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Param(String),
}

/// One segment of a path template.
#[derive(Debug)]
struct Segment {
    parts: Vec<Part>,
    /// 0: literal, 1: literal and parameters mixed (`{index}.{diffType}`), 2: one parameter.
    rank: u8,
}

/// One path template of the definition.
#[derive(Debug)]
pub struct Route {
    /// As written in the definition, e.g. `/repos/{owner}/{repo}/pulls/{index}`.
    pub template: String,
    segments: Vec<Segment>,
    /// A final `{filepath}` takes the rest of the path.
    rest: bool,
    /// The path item: method → operation.
    item: Map<String, Value>,
}

/// A route, its operation and the raw values of its path parameters.
type Found<'a> = (&'a Route, &'a Value, Vec<(String, String)>);

/// The route whose path fits (if any) and why there is no operation.
type NotFound<'a> = (Option<&'a Route>, String);

/// One call as the fake Forgejo logged it.
#[derive(Debug, Clone, Copy)]
pub struct ApiCall<'a> {
    /// Method, any case.
    pub method: &'a str,
    /// The raw request path (still percent-encoded, no query), `/api/v1` included.
    pub path: &'a str,
    /// Query parameters, decoded, in order (a name may repeat).
    pub query: &'a [(String, String)],
    /// The JSON body; `Null` when there was none.
    pub body: &'a Value,
}

/// The outcome of checking one call.
#[derive(Debug)]
pub struct Checked {
    /// `METHOD /template`: what the report groups calls by.
    pub key: String,
    /// The operation's `operationId`, when the operation exists.
    pub operation_id: Option<String>,
    /// Each violation: what is wrong (the same text for the same mistake, so they group)
    /// and the offending value.
    pub violations: Vec<(String, String)>,
}

/// The whole definition, indexed.
#[derive(Debug)]
pub struct Spec {
    base: String,
    /// `info.version`.
    pub version: String,
    definitions: Map<String, Value>,
    /// Most specific first (literal beats parameter, position by position).
    routes: Vec<Route>,
    /// Security parameters given in the query (`sudo`): allowed on every operation.
    global_query: BTreeSet<String>,
}

impl Route {
    fn new(template: &str, item: &Map<String, Value>) -> Self {
        let trimmed = template.trim_matches('/');
        let raw: Vec<&str> = if trimmed.is_empty() {
            Vec::new()
        } else {
            trimmed.split('/').collect()
        };
        let n = raw.len();
        let mut segments = Vec::new();
        let mut rest = false;
        for (i, seg) in raw.iter().enumerate() {
            let parts = template_parts(seg);
            let params = parts.iter().filter(|p| matches!(p, Part::Param(_))).count();
            let rank = match (params, parts.len()) {
                (0, _) => 0,
                (1, 1) => 2,
                _ => 1,
            };
            // Forgejo routes a branch as `/branches/*` (routers/api/v1/api.go:
            // `m.Get("/*", repo.GetBranch)`, `m.Delete("/*", …)`): its name may hold
            // slashes, as the merge queue's `shepherd/batch/<branch>/<id>` do.
            let branch_rest = *seg == "{branch}" && i > 0 && raw[i - 1] == "branches";
            if i + 1 == n && (*seg == "{filepath}" || branch_rest) {
                rest = true;
            }
            segments.push(Segment { parts, rank });
        }
        Self {
            template: template.to_owned(),
            segments,
            rest,
            item: item.clone(),
        }
    }

    fn ranks(&self) -> Vec<u8> {
        self.segments.iter().map(|s| s.rank).collect()
    }

    /// The raw (still encoded) values of the path parameters when `segs` fits.
    fn matches(&self, segs: &[&str]) -> Option<Vec<(String, String)>> {
        let n = self.segments.len();
        let joined;
        let segs: Vec<&str> = if self.rest {
            if segs.len() < n || n == 0 {
                return None;
            }
            joined = segs[n - 1..].join("/");
            let mut v = segs[..n - 1].to_vec();
            v.push(&joined);
            v
        } else {
            if segs.len() != n {
                return None;
            }
            segs.to_vec()
        };
        let mut params = Vec::new();
        for (seg, val) in self.segments.iter().zip(segs) {
            params.extend(match_parts(&seg.parts, val)?);
        }
        Some(params)
    }

    /// The methods this path has, upper case.
    fn methods(&self) -> Vec<String> {
        METHODS
            .iter()
            .filter(|m| self.item.contains_key(**m))
            .map(|m| m.to_uppercase())
            .collect()
    }
}

/// `{index}.{diffType}` → [Param(index), Lit(.), Param(diffType)].
fn template_parts(seg: &str) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut rest = seg;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        if open > 0 {
            parts.push(Part::Lit(rest[..open].to_owned()));
        }
        parts.push(Part::Param(rest[open + 1..open + close].to_owned()));
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Lit(rest.to_owned()));
    }
    parts
}

/// Matches one segment's parts against `val`: literals exactly, each parameter a
/// non-empty, shortest possible piece (backtracking when a later literal needs it).
fn match_parts(parts: &[Part], val: &str) -> Option<Vec<(String, String)>> {
    match parts.split_first() {
        None => val.is_empty().then(Vec::new),
        Some((Part::Lit(l), rest)) => match_parts(rest, val.strip_prefix(l.as_str())?),
        Some((Part::Param(name), rest)) => {
            if rest.is_empty() {
                return (!val.is_empty()).then(|| vec![(name.clone(), val.to_owned())]);
            }
            for (i, _) in val.char_indices().skip(1) {
                if let Some(mut found) = match_parts(rest, &val[i..]) {
                    found.insert(0, (name.clone(), val[..i].to_owned()));
                    return Some(found);
                }
            }
            None
        }
    }
}

/// Whether `s` is a `{placeholder}` of the source as a whole.
fn is_placeholder(s: &str) -> bool {
    s.len() > 2 && s.starts_with('{') && s.ends_with('}') && !s[1..s.len() - 1].contains(['{', '}'])
}

impl Spec {
    /// Parses and indexes a definition.
    pub fn parse(text: &str) -> Result<Self, String> {
        let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let paths = doc
            .get("paths")
            .and_then(Value::as_object)
            .ok_or("no paths")?;
        let mut routes: Vec<Route> = Vec::new();
        for (template, item) in paths {
            let item = item
                .as_object()
                .ok_or_else(|| format!("path {template} is not an object"))?;
            routes.push(Route::new(template, item));
        }
        routes.sort_by(|a, b| (a.ranks(), &a.template).cmp(&(b.ranks(), &b.template)));
        let global_query = doc
            .get("securityDefinitions")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|m| m.values())
            .filter(|s| s["type"] == "apiKey" && s["in"] == "query")
            .filter_map(|s| s["name"].as_str().map(str::to_owned))
            .collect();
        Ok(Self {
            base: doc["basePath"]
                .as_str()
                .unwrap_or("")
                .trim_end_matches('/')
                .to_owned(),
            version: doc["info"]["version"].as_str().unwrap_or("?").to_owned(),
            definitions: doc["definitions"].as_object().cloned().unwrap_or_default(),
            routes,
            global_query,
        })
    }

    /// Number of path templates and of operations.
    pub fn size(&self) -> (usize, usize) {
        let ops = self.routes.iter().map(|r| r.methods().len()).sum();
        (self.routes.len(), ops)
    }

    /// The route and operation for `method` on `sub` (the path below the base), with the
    /// raw path parameters; or the closest route (if any) and why there is no operation.
    fn find(&self, method: &str, sub: &str) -> Result<Found<'_>, NotFound<'_>> {
        let trimmed = sub.trim_matches('/');
        let segs: Vec<&str> = if trimmed.is_empty() {
            Vec::new()
        } else {
            trimmed.split('/').collect()
        };
        let m = method.to_lowercase();
        let mut first: Option<&Route> = None;
        for r in &self.routes {
            let Some(params) = r.matches(&segs) else {
                continue;
            };
            if let Some(op) = r.item.get(&m) {
                return Ok((r, op, params));
            }
            first.get_or_insert(r);
        }
        match first {
            None => Err((None, "no path template matches".to_owned())),
            Some(r) => Err((
                Some(r),
                format!(
                    "{} is not an operation of {} (it has {})",
                    method.to_uppercase(),
                    r.template,
                    r.methods().join(", ")
                ),
            )),
        }
    }

    /// `schema` with `$ref`s followed, and the name of the last definition reached.
    fn resolve<'a>(&'a self, mut schema: &'a Value) -> (&'a Value, Option<String>) {
        let mut name = None;
        for _ in 0..50 {
            let Some(r) = schema.get("$ref").and_then(Value::as_str) else {
                break;
            };
            let Some(def) = r.strip_prefix("#/definitions/") else {
                panic!("unsupported $ref {r:?} in the definition");
            };
            schema = self
                .definitions
                .get(def)
                .unwrap_or_else(|| panic!("$ref to a missing definition {r:?}"));
            name = Some(def.to_owned());
        }
        (schema, name)
    }

    /// `$ref` followed and `allOf` merged into one schema, with the definitions' names.
    fn flatten(&self, schema: &Value) -> (Value, Option<String>) {
        let (schema, name) = self.resolve(schema);
        let Some(all_of) = schema.get("allOf").and_then(Value::as_array) else {
            return (schema.clone(), name);
        };
        let mut merged: Map<String, Value> = schema
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| *k != "allOf")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let mut props = merged
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut required: Vec<Value> = merged
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut names: Vec<String> = name.into_iter().collect();
        for sub in all_of {
            let (s, n) = self.flatten(sub);
            names.extend(n);
            if let Some(p) = s.get("properties").and_then(Value::as_object) {
                props.extend(p.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            if let Some(r) = s.get("required").and_then(Value::as_array) {
                required.extend(r.iter().cloned());
            }
            for k in ["type", "additionalProperties"] {
                if let Some(v) = s.get(k) {
                    merged.entry(k).or_insert_with(|| v.clone());
                }
            }
        }
        merged.insert("properties".into(), Value::Object(props));
        merged.insert("required".into(), Value::Array(required));
        let name = (!names.is_empty()).then(|| names.join("+"));
        (Value::Object(merged), name)
    }

    /// Checks one call.
    pub fn check_call(&self, call: &ApiCall<'_>) -> Checked {
        let method = call.method.to_uppercase();
        let mut out: Vec<(String, String)> = Vec::new();
        let Some(sub) = strip_base(call.path, &self.base) else {
            return Checked {
                key: format!("{method} {}", call.path),
                operation_id: None,
                violations: vec![(
                    format!("not under {}: the API is served there only", self.base),
                    String::new(),
                )],
            };
        };
        let (route, op, params) = match self.find(&method, sub) {
            Ok(found) => found,
            Err((route, why)) => {
                return Checked {
                    key: format!("{method} {}", route.map_or(sub, |r| r.template.as_str())),
                    operation_id: None,
                    violations: vec![(format!("no such operation: {why}"), String::new())],
                };
            }
        };
        let mut declared: BTreeMap<(String, String), &Value> = BTreeMap::new();
        let mut body_param: Option<&Value> = None;
        for p in op["parameters"].as_array().into_iter().flatten() {
            let (inn, name) = (
                p["in"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or(""),
            );
            if inn == "body" {
                body_param = Some(p);
            } else {
                declared.insert((inn.to_owned(), name.to_owned()), p);
            }
        }
        for (name, raw) in &params {
            match declared.get(&("path".to_owned(), name.clone())) {
                None => out.push((
                    format!("path parameter {{{name}}} is not declared by the operation"),
                    String::new(),
                )),
                Some(p) => {
                    let decoded = percent_encoding::percent_decode_str(raw)
                        .decode_utf8_lossy()
                        .into_owned();
                    check_param(p, &[decoded], &format!("path {{{name}}}"), &mut out);
                }
            }
        }
        let mut query: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (k, v) in call.query {
            query.entry(k.as_str()).or_default().push(v.clone());
        }
        for (name, values) in &query {
            match declared.get(&("query".to_owned(), (*name).to_owned())) {
                None if self.global_query.contains(*name) => {}
                None => out.push((
                    format!("query parameter {name:?} is not declared by the operation"),
                    format!("{name}={}", short(&values.join(","), 60)),
                )),
                Some(p) => check_param(p, values, &format!("query {name}"), &mut out),
            }
        }
        for ((inn, name), p) in &declared {
            if inn == "query" && p["required"] == true && !query.contains_key(name.as_str()) {
                out.push((
                    format!("required query parameter {name:?} missing"),
                    String::new(),
                ));
            }
        }
        match (body_param, call.body) {
            (None, Value::Null) => {}
            (None, body) => out.push((
                "a body was sent, but the operation takes none".to_owned(),
                format!("body={}", short(&body.to_string(), 80)),
            )),
            (Some(bp), Value::Null) => {
                let (schema, name) = self.flatten(&bp["schema"]);
                let required: Vec<&str> = schema["required"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                if bp["required"] == true || !required.is_empty() {
                    out.push((
                        format!(
                            "no body, but {}{}",
                            if bp["required"] == true {
                                "the body parameter is required".to_owned()
                            } else {
                                name.unwrap_or_else(|| "the schema".into())
                            },
                            if required.is_empty() {
                                String::new()
                            } else {
                                format!(" requires {}", required.join(", "))
                            }
                        ),
                        String::new(),
                    ));
                }
            }
            (Some(bp), body) => self.check_value(body, &bp["schema"], "body", &mut out, None),
        }
        Checked {
            key: format!("{method} {}", route.template),
            operation_id: op["operationId"].as_str().map(str::to_owned),
            violations: out,
        }
    }

    /// Checks a JSON value against a schema; `at` is the JSON path, array indices as `[]`
    /// so that one kind of mistake groups as one violation.
    fn check_value(
        &self,
        value: &Value,
        schema: &Value,
        at: &str,
        out: &mut Vec<(String, String)>,
        owner: Option<&str>,
    ) {
        let (schema, name) = self.flatten(schema);
        let owner = name.as_deref().or(owner);
        let Some(obj) = schema.as_object().filter(|o| !o.is_empty()) else {
            return; // {}: anything goes
        };
        let want = obj
            .get("type")
            .and_then(Value::as_str)
            .or_else(|| obj.contains_key("properties").then_some("object"));
        let got = json_type(value);
        let shown = || format!("{at}={}", short(&value.to_string(), 60));
        if let Some(want) = want {
            // Go: an integer field refuses 1.0; a number field takes 1.
            if !(got == want || (want == "number" && got == "integer")) {
                let of = owner.map(|o| format!(" ({o})")).unwrap_or_default();
                out.push((
                    format!("{at}: {got} where the definition says {want}{of}"),
                    shown(),
                ));
                return;
            }
        }
        if let Some(allowed) = obj.get("enum").and_then(Value::as_array)
            && !allowed.contains(value)
        {
            out.push((
                format!(
                    "{at}: {} is not one of {}",
                    short(&value.to_string(), 40),
                    join_enum(allowed)
                ),
                shown(),
            ));
        }
        let format = obj.get("format").and_then(Value::as_str);
        if got == "integer"
            && let Some((lo, hi)) = format.and_then(int_range)
        {
            let n = value
                .as_i64()
                .map(i128::from)
                .or_else(|| value.as_u64().map(i128::from))
                .unwrap_or(0);
            if !(lo..=hi).contains(&n) {
                out.push((
                    format!("{at}: {n} out of the {} range", format.unwrap_or("")),
                    shown(),
                ));
            }
        }
        if let Value::String(s) = value
            && format == Some("date-time")
            && !is_rfc3339(s)
        {
            out.push((format!("{at}: not an RFC 3339 date-time"), shown()));
        }
        match value {
            Value::Array(items) => {
                if let Some(item_schema) = obj.get("items") {
                    for v in items {
                        self.check_value(v, item_schema, &format!("{at}[]"), out, owner);
                    }
                }
            }
            Value::Object(map) => self.check_object(map, obj, at, out, owner),
            _ => {}
        }
    }

    /// Keys of a JSON object against an object schema, as Go decodes them.
    fn check_object(
        &self,
        value: &Map<String, Value>,
        schema: &Map<String, Value>,
        at: &str,
        out: &mut Vec<(String, String)>,
        owner: Option<&str>,
    ) {
        let empty = Map::new();
        let props = schema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let additional = schema.get("additionalProperties");
        if props.is_empty() && additional.is_none() {
            return; // a free-form object
        }
        let label = owner.unwrap_or("the schema");
        let mut hit: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (k, v) in value {
            // Go's encoding/json: the exact name first, then a case-insensitive match.
            let prop = props.get_key_value(k).map(|(p, _)| p.as_str()).or_else(|| {
                props
                    .keys()
                    .find(|p| p.to_lowercase() == k.to_lowercase())
                    .map(String::as_str)
            });
            let Some(prop) = prop else {
                match additional {
                    Some(Value::Bool(true)) => {}
                    Some(a @ Value::Object(_)) => {
                        self.check_value(v, a, &format!("{at}.{k}"), out, owner);
                    }
                    _ => out.push((
                        format!("{at}: key {k:?} is not in {label}"),
                        format!("{at}.{k}={}", short(&v.to_string(), 60)),
                    )),
                }
                continue;
            };
            hit.entry(prop).or_default().push(k);
            self.check_value(v, &props[prop], &format!("{at}.{prop}"), out, owner);
        }
        for (prop, keys) in &hit {
            if keys.len() > 1 {
                out.push((
                    format!(
                        "{at}: keys {} all set {label}.{prop} (Go keeps the last)",
                        keys.join("/")
                    ),
                    format!("keys={}", keys.join("/")),
                ));
            }
        }
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !hit.contains_key(req) {
                let keys: Vec<&str> = value.keys().map(String::as_str).collect();
                out.push((
                    format!("{at}: required key {req:?} missing ({label})"),
                    format!(
                        "keys={}",
                        if keys.is_empty() {
                            "none".to_owned()
                        } else {
                            keys.join(",")
                        }
                    ),
                ));
            }
        }
    }

    /// Checks every call; returns whether all conform and the report: one PASS/FAIL
    /// line per distinct `METHOD /template` (each is one check), under each FAIL one
    /// line per distinct violation (all of them) with its count and one example call,
    /// then `api: N/M checks pass`.
    pub fn report(&self, calls: &[ApiCall<'_>]) -> (bool, String) {
        struct Group {
            op: Option<String>,
            calls: usize,
            bad: usize,
            violations: Vec<(String, usize, String)>,
        }
        let (paths, ops) = self.size();
        let mut text = format!(
            "info  definition: Forgejo {}, {paths} paths, {ops} operations; {} calls\n",
            self.version,
            calls.len()
        );
        let mut groups: BTreeMap<String, Group> = BTreeMap::new();
        for (seq, call) in calls.iter().enumerate() {
            let checked = self.check_call(call);
            let g = groups.entry(checked.key).or_insert(Group {
                op: checked.operation_id,
                calls: 0,
                bad: 0,
                violations: Vec::new(),
            });
            g.calls += 1;
            if !checked.violations.is_empty() {
                g.bad += 1;
            }
            for (what, detail) in checked.violations {
                if let Some(v) = g.violations.iter_mut().find(|v| v.0 == what) {
                    v.1 += 1;
                } else {
                    let mut ex = example(seq + 1, call);
                    if ex.ends_with("...") && !detail.is_empty() {
                        let _ = write!(ex, " [{detail}]");
                    }
                    g.violations.push((what, 1, ex));
                }
            }
        }
        let mut pass = 0;
        for (key, g) in &groups {
            let name = match &g.op {
                Some(op) => format!("{key} ({op})"),
                None => key.clone(),
            };
            if g.violations.is_empty() {
                pass += 1;
                let _ = writeln!(text, "PASS  {name}: {} calls conform", g.calls);
                continue;
            }
            let _ = writeln!(
                text,
                "FAIL  {name} -- {} of {} calls break the definition",
                g.bad, g.calls
            );
            for (what, count, ex) in &g.violations {
                let _ = writeln!(text, "        x{count}  {what}; e.g. {ex}");
            }
        }
        let _ = writeln!(text, "api: {pass}/{} checks pass", groups.len());
        (pass == groups.len(), text)
    }

    /// The route a path built by the source fits, and whether it has `method` (any
    /// method when `None`). A `{placeholder}` of the source may only fill a whole-segment
    /// parameter of the template; a literal segment of the source must equal a literal
    /// segment (or fit a mixed one such as `{index}.{diffType}`): a word of the source in
    /// a parameter's place would let `…/pulls/{n}/reviewz` pass as
    /// `…/pulls/{base}/{head}`.
    pub fn static_match(&self, method: Option<&str>, built: &str) -> (Option<&Route>, bool) {
        let segs: Vec<&str> = built.trim_matches('/').split('/').collect();
        let mut best = None;
        for r in &self.routes {
            if r.segments.len() != segs.len() {
                continue;
            }
            let fits = r.segments.iter().zip(&segs).all(|(seg, s)| {
                if is_placeholder(s) {
                    seg.rank == 2
                } else {
                    seg.rank != 2 && match_parts(&seg.parts, s).is_some()
                }
            });
            if !fits {
                continue;
            }
            match method {
                None => return (Some(r), true),
                Some(m) if r.item.contains_key(&m.to_lowercase()) => return (Some(r), true),
                Some(_) => {
                    best = best.or(Some(r));
                }
            }
        }
        (best, false)
    }
}

/// The path below `base`, or `None` when it is not under it.
fn strip_base<'a>(path: &'a str, base: &str) -> Option<&'a str> {
    if base.is_empty() {
        return Some(path);
    }
    match path.strip_prefix(base) {
        Some("") => Some("/"),
        Some(rest) if rest.starts_with('/') => Some(rest),
        _ => None,
    }
}

/// A path or query parameter given as text, against its declared type, format, enum
/// and minimum. `values`: every value the name was given.
fn check_param(param: &Value, values: &[String], at: &str, out: &mut Vec<(String, String)>) {
    let mut param = param;
    let mut vals: Vec<&str> = values.iter().map(String::as_str).collect();
    if param["type"] == "array" {
        let format = param["collectionFormat"].as_str().unwrap_or("csv");
        if format != "multi" {
            let sep = match format {
                "ssv" => " ",
                "tsv" => "\t",
                "pipes" => "|",
                _ => ",",
            };
            vals = vals
                .iter()
                .filter(|v| !v.is_empty())
                .flat_map(|v| v.split(sep))
                .collect();
        }
        param = &param["items"];
    } else if vals.len() > 1 {
        out.push((
            format!("{at}: given {} times, but it is not an array", vals.len()),
            format!("{at}={}", vals.join(",")),
        ));
    }
    for v in vals {
        let shown = || format!("{at}={}", short(v, 60));
        match param["type"].as_str() {
            Some("integer") => {
                let Ok(n) = v.strip_prefix('+').unwrap_or(v).parse::<i128>() else {
                    out.push((
                        format!("{at}: {:?} is not an integer", short(v, 40)),
                        shown(),
                    ));
                    continue;
                };
                let format = param["format"].as_str().unwrap_or("int64");
                let (lo, hi) = int_range(format).unwrap_or((i64::MIN.into(), i64::MAX.into()));
                if !(lo..=hi).contains(&n) {
                    out.push((format!("{at}: {v} out of the {format} range"), shown()));
                }
                if let Some(min) = param["minimum"].as_i64()
                    && n < i128::from(min)
                {
                    out.push((format!("{at}: {v} below the minimum {min}"), shown()));
                }
            }
            Some("boolean") => {
                // Go's strconv.ParseBool.
                const GO_BOOLS: [&str; 12] = [
                    "1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False",
                ];
                if !GO_BOOLS.contains(&v) {
                    out.push((
                        format!("{at}: {:?} is not a boolean", short(v, 40)),
                        shown(),
                    ));
                }
            }
            Some("string") if param["format"] == "date-time" && !is_rfc3339(v) => {
                out.push((
                    format!("{at}: {:?} is not an RFC 3339 date-time", short(v, 40)),
                    shown(),
                ));
            }
            _ => {}
        }
        if let Some(allowed) = param["enum"].as_array() {
            let ok = allowed.iter().any(|e| match e {
                Value::String(s) => s == v,
                other => v.parse::<Value>().ok().as_ref() == Some(other),
            });
            if !ok {
                out.push((
                    format!(
                        "{at}: {:?} is not one of {}",
                        short(v, 40),
                        join_enum(allowed)
                    ),
                    shown(),
                ));
            }
        }
    }
}

/// The JSON type of a value as Swagger names it.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The range of an integer format.
fn int_range(format: &str) -> Option<(i128, i128)> {
    match format {
        "int64" => Some((i64::MIN.into(), i64::MAX.into())),
        "int32" => Some((i32::MIN.into(), i32::MAX.into())),
        "uint64" => Some((0, u64::MAX.into())),
        _ => None,
    }
}

/// `2001-02-03T12:00:00Z`, `…T12:00:00.5+02:00`: RFC 3339 as Go's time.RFC3339 reads it.
pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if b.len() < 20
        || !digits(0..4)
        || b[4] != b'-'
        || !digits(5..7)
        || b[7] != b'-'
        || !digits(8..10)
        || !matches!(b[10], b'T' | b't')
        || !digits(11..13)
        || b[13] != b':'
        || !digits(14..16)
        || b[16] != b':'
        || !digits(17..19)
    {
        return false;
    }
    let mut i = 19;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match &b[i..] {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', ..] => {
            b.len() == i + 6 && digits(i + 1..i + 3) && b[i + 3] == b':' && digits(i + 4..i + 6)
        }
        _ => false,
    }
}

fn join_enum(allowed: &[Value]) -> String {
    allowed
        .iter()
        .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
        .collect::<Vec<_>>()
        .join("|")
}

/// `s` cut to `n` characters, `...` marking the cut.
fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_owned();
    }
    let mut cut: String = s.chars().take(n.saturating_sub(3)).collect();
    cut.push_str("...");
    cut
}

/// One call, for a report line.
fn example(seq: usize, call: &ApiCall<'_>) -> String {
    let mut s = format!("call {seq}: {} {}", call.method, call.path);
    if !call.query.is_empty() {
        let q: Vec<String> = call.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = write!(s, "?{}", q.join("&"));
    }
    if !call.body.is_null() {
        let _ = write!(s, " body={}", short(&call.body.to_string(), 140));
    }
    s
}

// ---------------------------------------------------------------------------------------
// The static scan: API paths built in the project's source
// ---------------------------------------------------------------------------------------

/// One place in the source that builds an API path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// `file:line`.
    pub at: String,
    /// The method of the request the path is used for, when the scan can tell.
    pub method: Option<String>,
    /// The path as built, placeholders as `{name}` (`repo_path(..)` as
    /// `/repos/{owner}/{repo}`).
    pub built: String,
}

/// The functions of the client that take an API path (`send` and `send_json` take the
/// method first; the others are GETs).
const REQUEST_FNS: [&str; 5] = [
    "get_json(",
    "get_all(",
    "get_text_capped(",
    "send_json(",
    "send(",
];

/// Every API path the Rust source `text` of `file` builds: `format!` templates that
/// start with `/` (or with `{}` given `repo_path(..)`), string literals and
/// `&repo_path(..)?` given straight to a request function. Unit tests (`#[cfg(test)]`)
/// and comments are left out.
pub fn static_sites(file: &str, text: &str) -> Vec<Site> {
    let text = match text.find("#[cfg(test)]") {
        Some(cut) => &text[..cut],
        None => text,
    };
    let code = strip_comments(text);
    let line_of = |pos: usize| code[..pos].matches('\n').count() + 1;
    let mut sites = Vec::new();
    // format!("…", args)
    let mut from = 0;
    while let Some(i) = code[from..].find("format!(") {
        let start = from + i;
        from = start + 8;
        let end = closing_paren(&code, start + 7);
        let inner = &code[start + 8..end];
        let Some((template, args)) = split_template(inner) else {
            continue;
        };
        if let Some(built) = build_template(&template, &args) {
            sites.push(Site {
                at: format!("{file}:{}", line_of(start)),
                method: infer_method(&code[end..]),
                built,
            });
        }
    }
    // get_json("/version", …), send(Method::X, "/…", …), get_json(&repo_path(repo)?, …)
    for f in REQUEST_FNS {
        let mut from = 0;
        while let Some(i) = code[from..].find(f) {
            let start = from + i;
            from = start + f.len();
            if start > 0 && is_ident(code.as_bytes()[start - 1]) {
                continue; // another function ending in the same name
            }
            let end = closing_paren(&code, start + f.len() - 1);
            let args = split_args(&code[start + f.len()..end]);
            let (method, path) = if f.starts_with("send") {
                let m = args
                    .first()
                    .and_then(|a| {
                        a.rsplit("Method::")
                            .next()
                            .filter(|_| a.contains("Method::"))
                    })
                    .map(str::to_owned);
                (m, args.get(1))
            } else {
                (Some("GET".to_owned()), args.first())
            };
            let Some(path) = path else { continue };
            let built = if let Some(lit) = path.strip_prefix('"').and_then(|p| p.strip_suffix('"'))
            {
                lit.to_owned()
            } else if path.trim_start_matches('&').starts_with("repo_path(") {
                "/repos/{owner}/{repo}".to_owned()
            } else {
                continue; // a variable: its format! is a site of its own
            };
            sites.push(Site {
                at: format!("{file}:{}", line_of(start)),
                method,
                built,
            });
        }
    }
    sites.sort_by_key(|s| {
        let line: usize =
            s.at.rsplit(':')
                .next()
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
        line
    });
    sites
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The source with `//` comments blanked (string literals kept, lengths unchanged).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_str = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        if c == '"' {
            in_str = true;
            out.push(c);
        } else if c == '/' && chars.peek() == Some(&'/') {
            out.push(' ');
            for n in chars.by_ref() {
                if n == '\n' {
                    out.push('\n');
                    break;
                }
                out.push(' ');
            }
        } else if c == '\'' {
            // A char literal ('"', '\'', '\\') must not open a string; a lifetime
            // ('a) passes as it is.
            out.push(c);
            let mut ahead = chars.clone();
            match (ahead.next(), ahead.next()) {
                (Some('\\'), Some(escaped)) => {
                    out.push('\\');
                    out.push(escaped);
                    chars.next();
                    chars.next();
                    for n in chars.by_ref() {
                        out.push(n);
                        if n == '\'' {
                            break;
                        }
                    }
                }
                (Some(ch), Some('\'')) => {
                    out.push(ch);
                    out.push('\'');
                    chars.next();
                    chars.next();
                }
                _ => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Index of the parenthesis closing the one at `open` (string literals skipped).
fn closing_paren(code: &str, open: usize) -> usize {
    let b = code.as_bytes();
    let (mut depth, mut j) = (0i32, open);
    while j < b.len() {
        match b[j] {
            b'"' => {
                j += 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
        j += 1;
    }
    b.len()
}

/// Top-level, comma-separated arguments (string literals and brackets respected).
fn split_args(s: &str) -> Vec<String> {
    let mut args = Vec::new();
    let (mut depth, mut cur, mut in_str, mut esc) = (0i32, String::new(), false, false);
    for c in s.chars() {
        if in_str {
            cur.push(c);
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                if !cur.trim().is_empty() {
                    args.push(cur.trim().to_owned());
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        args.push(cur.trim().to_owned());
    }
    args
}

/// A `format!`'s inside → its template (unescaped minimally) and its arguments.
fn split_template(inner: &str) -> Option<(String, Vec<String>)> {
    let mut args = split_args(inner);
    if args.is_empty() {
        return None;
    }
    let first = args.remove(0);
    let lit = first.strip_prefix('"')?.strip_suffix('"')?;
    Some((lit.to_owned(), args))
}

/// A `format!` template → an API path with `{placeholders}`, or `None` when it is none.
/// A `{}` whose argument is `repo_path(..)` becomes `/repos/{owner}/{repo}`.
fn build_template(template: &str, args: &[String]) -> Option<String> {
    if template.contains("/api/v1") || template.contains("://") || !template.contains('/') {
        return None;
    }
    let mut out = String::new();
    let mut next_arg = args.iter();
    let mut rest = template;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("{{") {
            out.push('{');
            rest = r;
        } else if let Some(r) = rest.strip_prefix("}}") {
            out.push('}');
            rest = r;
        } else if rest.starts_with('{') {
            let close = rest.find('}')?;
            let name = rest[1..close].split(':').next().unwrap_or("");
            rest = &rest[close + 1..];
            if name.is_empty() {
                let arg = next_arg.next().map_or("", String::as_str);
                if arg.trim_start_matches('&').starts_with("repo_path(") {
                    out.push_str("/repos/{owner}/{repo}");
                    continue;
                }
                let name: String = arg
                    .chars()
                    .map(|c| if c.is_alphanumeric() { c } else { '_' })
                    .collect();
                let name = name.trim_matches('_');
                let _ = write!(out, "{{{}}}", if name.is_empty() { "arg" } else { name });
            } else {
                let _ = write!(out, "{{{name}}}");
            }
        } else {
            let c = rest.chars().next()?;
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    let path_like = out.starts_with('/')
        && out
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_{}.-".contains(c));
    path_like.then_some(out)
}

/// The method of the first request after a `format!`, within the same function.
fn infer_method(after: &str) -> Option<String> {
    let body = match after
        .find("\n    pub")
        .into_iter()
        .chain(after.find(" fn "))
        .min()
    {
        Some(end) => &after[..end],
        None => after,
    };
    let method = body.find("Method::").map(|i| {
        let name: String = body[i + 8..]
            .chars()
            .take_while(char::is_ascii_uppercase)
            .collect();
        (i, name)
    });
    let get = [
        "get_json(",
        "get_all(",
        "get_text_capped(",
        "get_text_tail(",
    ]
    .iter()
    .filter_map(|f| body.find(f))
    .min()
    .map(|i| (i, "GET".to_owned()));
    match (method, get) {
        (Some(a), Some(b)) => Some(if a.0 < b.0 { a.1 } else { b.1 }),
        (a, b) => a.or(b).map(|x| x.1).filter(|m| !m.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(method: &str, path: &str, query: &[(&str, &str)], body: Value) -> Vec<String> {
        let query: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let call = ApiCall {
            method,
            path,
            query: &query,
            body: &body,
        };
        spec()
            .check_call(&call)
            .violations
            .into_iter()
            .map(|(what, _)| what)
            .collect()
    }

    fn passes(method: &str, path: &str, query: &[(&str, &str)], body: Value) {
        let v = check(method, path, query, body);
        assert!(v.is_empty(), "{method} {path} should conform: {v:#?}");
    }

    fn rejected(method: &str, path: &str, query: &[(&str, &str)], body: Value, why: &str) {
        let v = check(method, path, query, body);
        assert!(
            v.iter().any(|w| w.contains(why)),
            "{method} {path} should be rejected with {why:?}; got {v:#?}"
        );
    }

    #[test]
    fn openapi_definition_loads_with_its_provenance() {
        let s = spec();
        assert_eq!(s.version, "15.0.3+gitea-1.22.0");
        assert_eq!(s.size(), (314, 491));
        assert!(s.global_query.contains("sudo"));
    }

    #[test]
    fn openapi_operation_must_exist() {
        passes("GET", "/api/v1/repos/o/r/pulls/3", &[], Value::Null);
        passes("get", "/api/v1/version", &[], Value::Null);
        rejected(
            "GET",
            "/api/v1/repos/o/r/pulls/3/rebase/now",
            &[],
            Value::Null,
            "no such operation: no path template",
        );
        // matches GET /repos/{owner}/{repo}/pulls/{base}/{head} by its path, not its method
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/rebase",
            &[],
            Value::Null,
            "POST is not an operation of /repos/{owner}/{repo}/pulls/{base}/{head}",
        );
        rejected(
            "PUT",
            "/api/v1/repos/o/r/pulls/3/merge",
            &[],
            Value::Null,
            "PUT is not an operation of /repos/{owner}/{repo}/pulls/{index}/merge",
        );
        rejected(
            "GET",
            "/repos/o/r/pulls/3",
            &[],
            Value::Null,
            "not under /api/v1",
        );
    }

    #[test]
    fn openapi_literal_segment_beats_a_parameter() {
        // /issues/comments/{id} and not /issues/{index}/comments... with index=comments
        let checked = spec().check_call(&ApiCall {
            method: "PATCH",
            path: "/api/v1/repos/o/r/issues/comments/9",
            query: &[],
            body: &json!({"body": "x"}),
        });
        assert_eq!(
            checked.key,
            "PATCH /repos/{owner}/{repo}/issues/comments/{id}"
        );
        assert!(checked.violations.is_empty(), "{:?}", checked.violations);
    }

    #[test]
    fn openapi_mixed_segment_and_filepath() {
        passes("GET", "/api/v1/repos/o/r/pulls/3.diff", &[], Value::Null);
        rejected(
            "GET",
            "/api/v1/repos/o/r/pulls/3.pdf",
            &[],
            Value::Null,
            "is not one of diff|patch",
        );
        passes("GET", "/api/v1/repos/o/r/raw/a/b/c.txt", &[], Value::Null);
    }

    #[test]
    fn openapi_path_parameter_typed() {
        passes("GET", "/api/v1/repos/o/r/issues/12", &[], Value::Null);
        rejected(
            "GET",
            "/api/v1/repos/o/r/issues/twelve",
            &[],
            Value::Null,
            "path {index}: \"twelve\" is not an integer",
        );
        rejected(
            "GET",
            "/api/v1/repos/o/r/issues/99999999999999999999",
            &[],
            Value::Null,
            "out of the int64 range",
        );
        // percent-encoded values are decoded before the check
        passes(
            "GET",
            "/api/v1/repos/o/r/branches/feature%2Fx",
            &[],
            Value::Null,
        );
    }

    #[test]
    fn openapi_query_parameters_declared_and_typed() {
        passes(
            "GET",
            "/api/v1/repos/o/r/pulls",
            &[("state", "open"), ("page", "2"), ("limit", "50")],
            Value::Null,
        );
        passes(
            "GET",
            "/api/v1/repos/o/r/pulls",
            &[("sudo", "admin")],
            Value::Null,
        );
        rejected(
            "GET",
            "/api/v1/repos/o/r/pulls",
            &[("base", "main")],
            Value::Null,
            "query parameter \"base\" is not declared",
        );
        rejected(
            "GET",
            "/api/v1/repos/o/r/pulls",
            &[("page", "two")],
            Value::Null,
            "query page: \"two\" is not an integer",
        );
        rejected(
            "GET",
            "/api/v1/repos/o/r/pulls",
            &[("state", "opened")],
            Value::Null,
            "query state: \"opened\" is not one of",
        );
        rejected(
            "GET",
            "/api/v1/repos/o/r/pulls",
            &[("page", "1"), ("page", "2")],
            Value::Null,
            "given 2 times, but it is not an array",
        );
    }

    #[test]
    fn openapi_query_boolean_date_time_array_and_required() {
        passes(
            "GET",
            "/api/v1/repos/o/r/issues",
            &[("labels", "a,b"), ("since", "2001-02-03T03:04:05Z")],
            Value::Null,
        );
        rejected(
            "GET",
            "/api/v1/repos/o/r/issues",
            &[("since", "2001-02-03 03:04:05")],
            Value::Null,
            "is not an RFC 3339 date-time",
        );
        passes(
            "GET",
            "/api/v1/repos/o/r/commits",
            &[("stat", "false")],
            Value::Null,
        );
        rejected(
            "GET",
            "/api/v1/repos/o/r/commits",
            &[("stat", "no")],
            Value::Null,
            "query stat: \"no\" is not a boolean",
        );
        // array, multi: each repetition is an item; items typed (enum)
        passes(
            "GET",
            "/api/v1/repos/issues/search",
            &[("type", "issues")],
            Value::Null,
        );
        passes(
            "GET",
            "/api/v1/notifications",
            &[("subject-type", "pull"), ("subject-type", "issue")],
            Value::Null,
        );
        rejected(
            "GET",
            "/api/v1/notifications",
            &[("subject-type", "pulls")],
            Value::Null,
            "query subject-type: \"pulls\" is not one of issue|pull|repository",
        );
        // required query parameter
        passes(
            "POST",
            "/api/v1/repos/o/r/pulls/3/update",
            &[("style", "rebase")],
            Value::Null,
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/update",
            &[("style", "squash")],
            Value::Null,
            "is not one of merge|rebase",
        );
        rejected(
            "GET",
            "/api/v1/repos/search",
            &[("limit", "x")],
            Value::Null,
            "not an integer",
        );
    }

    #[test]
    fn openapi_required_query_parameter_missing_is_rejected() {
        // the one operation this checker knows with a required query parameter
        let op = spec()
            .routes
            .iter()
            .flat_map(|r| {
                METHODS
                    .iter()
                    .filter_map(move |m| Some((r, *m, r.item.get(*m)?)))
            })
            .find(|(_, _, op)| {
                op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["in"] == "query" && p["required"] == true)
            });
        let (route, method, _) =
            op.expect("the definition has an operation with a required query parameter");
        let path: String = route
            .segments
            .iter()
            .map(|s| {
                s.parts
                    .iter()
                    .map(|p| match p {
                        Part::Lit(l) => l.clone(),
                        Part::Param(_) => "1".to_owned(),
                    })
                    .collect::<String>()
            })
            .fold(String::from("/api/v1"), |acc, s| acc + "/" + &s);
        rejected(
            &method.to_uppercase(),
            &path,
            &[],
            Value::Null,
            "required query parameter",
        );
    }

    #[test]
    fn openapi_body_keys_in_schema_case_insensitive_as_go() {
        passes(
            "POST",
            "/api/v1/repos/o/r/pulls/3/merge",
            &[],
            json!({"Do": "merge", "MergeMessageField": "m", "mergetitlefield": "t"}),
        );
        // Go decodes "do" into Do: no finding
        passes(
            "POST",
            "/api/v1/repos/o/r/pulls/3/merge",
            &[],
            json!({"do": "squash"}),
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/merge",
            &[],
            json!({"Do": "merge", "strategy": "x"}),
            "key \"strategy\" is not in MergePullRequestOption",
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/merge",
            &[],
            json!({"Do": "merge", "do": "merge"}),
            "all set MergePullRequestOption.Do",
        );
    }

    #[test]
    fn openapi_body_required_keys_and_enums() {
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/merge",
            &[],
            json!({"MergeMessageField": "m"}),
            "required key \"Do\" missing",
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/merge",
            &[],
            json!({"Do": "Do"}),
            "body.Do: \"Do\" is not one of merge|rebase",
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/merge",
            &[],
            Value::Null,
            "no body, but MergePullRequestOption requires Do",
        );
        passes(
            "POST",
            "/api/v1/repos/o/r/issues/3/comments",
            &[],
            json!({"body": "hi"}),
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/issues/3/comments",
            &[],
            json!({}),
            "required key \"body\" missing",
        );
    }

    #[test]
    fn openapi_body_types_refs_and_arrays() {
        passes(
            "POST",
            "/api/v1/repos/o/r/statuses/abc",
            &[],
            json!({"state": "success", "context": "ci", "target_url": "", "description": "ok"}),
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/statuses/abc",
            &[],
            json!({"state": 1}),
            "body.state: integer where the definition says string",
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/issues/3/comments",
            &[],
            json!({"body": null}),
            "body.body: null where the definition says string",
        );
        // a $ref inside an array, items checked
        passes(
            "POST",
            "/api/v1/repos/o/r/pulls/3/reviews",
            &[],
            json!({"event": "COMMENT", "body": "b", "comments": [{"path": "a.rs", "body": "c", "new_position": 3}]}),
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/reviews",
            &[],
            json!({"event": "COMMENT", "comments": [{"path": "a.rs", "line": 3}]}),
            "body.comments[]: key \"line\" is not in CreatePullReviewComment",
        );
        rejected(
            "POST",
            "/api/v1/repos/o/r/pulls/3/reviews",
            &[],
            json!({"event": "COMMENT", "comments": [{"new_position": 1.5}]}),
            "number where the definition says integer",
        );
        rejected(
            "GET",
            "/api/v1/repos/o/r/pulls/3",
            &[],
            json!({"x": 1}),
            "a body was sent, but the operation takes none",
        );
        // dates in bodies
        rejected(
            "PATCH",
            "/api/v1/repos/o/r/issues/3",
            &[],
            json!({"due_date": "tomorrow"}),
            "body.due_date: not an RFC 3339 date-time",
        );
        passes(
            "PATCH",
            "/api/v1/repos/o/r/issues/3",
            &[],
            json!({"due_date": "2001-07-01T00:00:00.123+02:00"}),
        );
    }

    #[test]
    fn openapi_report_lists_every_violation() {
        let q: Vec<(String, String)> = vec![("state".into(), "bogus".into())];
        let (b1, b2, null) = (json!({"Do": "Do"}), json!({"Do": "merge"}), Value::Null);
        let calls = [
            ApiCall {
                method: "GET",
                path: "/api/v1/repos/o/r/pulls",
                query: &q,
                body: &null,
            },
            ApiCall {
                method: "POST",
                path: "/api/v1/repos/o/r/pulls/1/merge",
                query: &[],
                body: &b1,
            },
            ApiCall {
                method: "POST",
                path: "/api/v1/repos/o/r/pulls/2/merge",
                query: &[],
                body: &b2,
            },
            ApiCall {
                method: "GET",
                path: "/api/v1/version",
                query: &[],
                body: &null,
            },
        ];
        let (ok, text) = spec().report(&calls);
        assert!(!ok, "{text}");
        assert!(
            text.contains("FAIL  GET /repos/{owner}/{repo}/pulls (repoListPullRequests)"),
            "{text}"
        );
        assert!(text.contains("FAIL  POST /repos/{owner}/{repo}/pulls/{index}/merge (repoMergePullRequest) -- 1 of 2 calls"), "{text}");
        assert!(text.contains("x1  body.Do: \"Do\" is not one of"), "{text}");
        assert!(text.contains("PASS  GET /version"), "{text}");
        assert!(text.ends_with("api: 1/3 checks pass\n"), "{text}");
        let (ok, text) = spec().report(&calls[3..]);
        assert!(ok, "{text}");
    }

    #[test]
    fn openapi_rfc3339() {
        for good in [
            "2001-02-03T03:04:05Z",
            "2001-02-03t03:04:05.123456789+05:30",
            "2001-02-03T03:04:05-00:00",
        ] {
            assert!(is_rfc3339(good), "{good}");
        }
        for bad in [
            "2001-02-03",
            "2001-02-03 03:04:05Z",
            "2001-02-03T03:04:05",
            "2001-02-03T03:04:05.Z",
            "2001-02-03T03:04:05+0530",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
    }

    /// A route newer than the v15 definition that `src/forgejo/` may call, with the
    /// Forgejo source that defines it; the client must cope with its 404 on v15.
    struct NewerRoute {
        /// The method.
        method: &'static str,
        /// The path as the source builds it (placeholders in `{}`).
        template: &'static str,
        /// Where Forgejo defines it (file, line, branch and commit).
        source: &'static str,
    }

    /// The routes `src/forgejo/` calls that v15 does not have.
    const NEWER_THAN_V15: [NewerRoute; 2] = [
        NewerRoute {
            method: "GET",
            template: "/repos/{owner}/{repo}/actions/runs/{run_id}/jobs",
            source: "Forgejo v16.0/forgejo 4695780d410cbb362ed6db9270be71867b43eb0a \
                     routers/api/v1/api.go:897 → routers/api/v1/repo/action.go ListActionRunJobs",
        },
        NewerRoute {
            method: "GET",
            template: "/repos/{owner}/{repo}/actions/jobs/{job_id}/logs",
            source: "Forgejo v16.0/forgejo 4695780d410cbb362ed6db9270be71867b43eb0a \
                     routers/api/v1/api.go:891 → routers/api/v1/repo/action.go GetActionJobLogs",
        },
    ];

    /// The allowance a site falls under: same method, same segments, a placeholder
    /// exactly where the allowance has one.
    fn newer_route(site: &Site) -> Option<&'static NewerRoute> {
        let segs: Vec<&str> = site.built.trim_matches('/').split('/').collect();
        NEWER_THAN_V15.iter().find(|n| {
            let want: Vec<&str> = n.template.trim_matches('/').split('/').collect();
            site.method.as_deref() == Some(n.method)
                && want.len() == segs.len()
                && want.iter().zip(&segs).all(|(w, s)| {
                    let (wp, sp) = (is_placeholder(w), is_placeholder(s));
                    (wp && sp) || (!wp && !sp && w == s)
                })
        })
    }

    /// Every API path `src/forgejo/` builds is an operation of the definition, with the
    /// method the code uses (a path Forgejo does not have fails here, naming its line),
    /// or one of [`NEWER_THAN_V15`], each cited from Forgejo's source.
    #[test]
    fn openapi_static_scan_of_src_forgejo() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/forgejo");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("src/forgejo is readable")
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .collect();
        files.sort();
        let mut sites = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).expect("a source file");
            let name = format!(
                "src/forgejo/{}",
                f.file_name().unwrap_or_default().to_string_lossy()
            );
            sites.extend(static_sites(&name, &text));
        }
        let mut bad = Vec::new();
        let mut operations = BTreeSet::new();
        let mut used_newer = BTreeSet::new();
        for s in &sites {
            match spec().static_match(s.method.as_deref(), &s.built) {
                (Some(r), true) => {
                    if let Some(m) = &s.method {
                        operations.insert(format!("{m} {}", r.template));
                    }
                }
                (Some(r), false) => bad.push(format!(
                    "{}: {} {} — the definition's {} has only {}",
                    s.at,
                    s.method.as_deref().unwrap_or("?"),
                    s.built,
                    r.template,
                    r.methods().join(", ")
                )),
                (None, _) if newer_route(s).is_some() => {
                    used_newer.extend(newer_route(s).map(|n| n.template));
                }
                (None, _) => bad.push(format!(
                    "{}: {} {} matches no path of Forgejo {}'s API",
                    s.at,
                    s.method.as_deref().unwrap_or("?"),
                    s.built,
                    spec().version
                )),
            }
        }
        for n in NEWER_THAN_V15 {
            assert!(
                used_newer.contains(n.template),
                "{} {} is allowed as newer than v15 but src/forgejo/ no longer calls it",
                n.method,
                n.template
            );
            assert!(
                spec().static_match(Some(n.method), n.template).0.is_none(),
                "{} {} is in the v15 definition: it needs no allowance",
                n.method,
                n.template
            );
            assert!(
                n.source.contains("routers/api/v1/api.go") && n.source.contains("4695780d"),
                "{}: the allowance must cite Forgejo's source (file and commit)",
                n.template
            );
        }
        assert!(
            bad.is_empty(),
            "API paths built in src/forgejo/ that Forgejo does not have:\n{}",
            bad.join("\n")
        );
        // The scan must see the client's requests, or it proves nothing.
        assert!(
            sites.len() >= 20,
            "only {} sites found: {sites:#?}",
            sites.len()
        );
        for op in [
            "GET /version",
            "GET /user",
            "GET /repos/{owner}/{repo}",
            "GET /repos/{owner}/{repo}/pulls",
            "POST /repos/{owner}/{repo}/pulls/{index}/merge",
            "POST /repos/{owner}/{repo}/pulls/{index}/update",
            "PATCH /repos/{owner}/{repo}/issues/comments/{id}",
            "GET /repos/{owner}/{repo}/commits/{ref}/status",
            "DELETE /repos/{owner}/{repo}/issues/{index}/labels/{identifier}",
        ] {
            assert!(
                operations.contains(op),
                "{op} not found by the scan; found {operations:#?}"
            );
        }
    }

    #[test]
    fn openapi_static_scan_finds_and_rejects() {
        let src = r#"
impl ForgejoClient {
    pub async fn a(&self, repo: &str, number: u64) -> R {
        let path = format!("{}/pulls/{number}/merge", repo_path(repo)?);
        self.send(Method::POST, &path, &[], None).await
    }
    pub async fn b(&self, repo: &str, number: u64) -> R {
        // format!("{}/nowhere", repo_path(repo)?) in a comment is no site
        let path = format!("{}/pulls/{number}/rebase", repo_path(repo)?);
        self.send(Method::POST, &path, &[], None).await
    }
    pub async fn c(&self, repo: &str, number: u64) -> R {
        let path = format!("{}/pulls/{number}/merge", repo_path(repo)?);
        self.send(Method::PUT, &path, &[], None).await
    }
    pub async fn d(&self, repo: &str) -> R {
        self.get_json(&repo_path(repo)?, &[]).await?;
        self.get_json("/version", &[]).await
    }
}
#[cfg(test)]
mod tests {
    fn t() { let _ = format!("/not/an/api/{}", 1); }
}
"#;
        let sites = static_sites("x.rs", src);
        let got: Vec<(Option<&str>, &str)> = sites
            .iter()
            .map(|s| (s.method.as_deref(), s.built.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (Some("POST"), "/repos/{owner}/{repo}/pulls/{number}/merge"),
                (Some("POST"), "/repos/{owner}/{repo}/pulls/{number}/rebase"),
                (Some("PUT"), "/repos/{owner}/{repo}/pulls/{number}/merge"),
                (Some("GET"), "/repos/{owner}/{repo}"),
                (Some("GET"), "/version"),
            ]
        );
        let verdicts: Vec<bool> = sites
            .iter()
            .map(|s| spec().static_match(s.method.as_deref(), &s.built).1)
            .collect();
        assert_eq!(verdicts, [true, false, false, true, true]);
        // a source placeholder fills only a whole-segment parameter
        assert!(
            !spec()
                .static_match(Some("GET"), "/repos/{owner}/{repo}/{what}")
                .1
        );
        // a word of the source does not fill a parameter: no /pulls/{base}/{head} here
        assert!(
            !spec()
                .static_match(Some("GET"), "/repos/{owner}/{repo}/pulls/{number}/reviewz")
                .1
        );
        assert!(
            spec()
                .static_match(Some("GET"), "/repos/{owner}/{repo}/pulls/{number}/reviews")
                .1
        );
        assert!(
            spec()
                .static_match(Some("GET"), "/repos/{owner}/{repo}/pulls/{number}.diff")
                .1
        );
    }
}
