//! The deploy files (Dockerfile, docker-compose.yml, Kubernetes manifests, the systemd unit and
//! its config file) parse, and every flag, variable, port, path and command they use is one the
//! binary has.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::Command,
};

use yaml_rust2::{Yaml, YamlLoader};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn help(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .args(args)
        .arg("--help")
        .env_remove("BOTFLEET_CONFIG")
        .output()
        .unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()
}

/// `--flags` and `BOTFLEET_*` names in a text.
fn names(text: &str, prefix: &str, ok: impl Fn(char) -> bool) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let tail = &rest[i + prefix.len()..];
        let n = tail.find(|c: char| !ok(c)).unwrap_or(tail.len());
        if n > 0 {
            out.insert(format!("{prefix}{}", &tail[..n]));
        }
        rest = &tail[n..];
    }
    out
}

/// What `botfleet worker` accepts: its flags and the variables its help names.
struct Worker {
    flags: HashSet<String>,
    vars: HashSet<String>,
}

fn worker() -> Worker {
    let h = help(&["worker"]);
    Worker {
        flags: names(&h, "--", |c| c.is_ascii_lowercase() || c == '-'),
        vars: names(&h, "BOTFLEET_", |c| c.is_ascii_uppercase() || c == '_'),
    }
}

impl Worker {
    fn check_args(&self, args: &[String], whence: &str) {
        assert_eq!(
            args.first().map(String::as_str),
            Some("worker"),
            "{whence}: {args:?}"
        );
        for a in args.iter().filter(|a| a.starts_with("--")) {
            let flag = a.split('=').next().unwrap();
            assert!(self.flags.contains(flag), "{whence}: unknown flag {flag}");
        }
    }

    fn check_var(&self, name: &str, whence: &str) {
        if name.starts_with("BOTFLEET_") {
            assert!(
                self.vars.contains(name),
                "{whence}: unknown variable {name}"
            );
        }
    }

    /// The port of `--http-addr` in `args`, else of `BOTFLEET_HTTP_ADDR` in `env`.
    fn http_port(args: &[String], env: &[(String, String)]) -> u16 {
        Self::port_of("--http-addr", "BOTFLEET_HTTP_ADDR", args, env)
    }

    /// The port of `--hooks-addr` in `args`, else of `BOTFLEET_HOOKS_ADDR` in `env`.
    fn hooks_port(args: &[String], env: &[(String, String)]) -> u16 {
        Self::port_of("--hooks-addr", "BOTFLEET_HOOKS_ADDR", args, env)
    }

    fn port_of(flag: &str, var: &str, args: &[String], env: &[(String, String)]) -> u16 {
        let from_args = args
            .iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned();
        let addr = from_args
            .or_else(|| env.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone()))
            .unwrap_or_else(|| panic!("{flag}: an address beyond loopback"));
        assert!(
            !addr.starts_with("127."),
            "a container must listen beyond loopback: {addr}"
        );
        addr.rsplit(':').next().unwrap().parse().unwrap()
    }
}

fn yaml(rel: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A mapping with YAML merge keys (`<<: *anchor`) applied.
fn merged(y: &Yaml) -> yaml_rust2::yaml::Hash {
    let mut out = yaml_rust2::yaml::Hash::new();
    let Yaml::Hash(h) = y else { return out };
    if let Some(base) = h.get(&Yaml::String("<<".into())) {
        out.extend(merged(base));
    }
    for (k, v) in h {
        if k.as_str() != Some("<<") {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .map(|s| match s {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    other => panic!("not a string: {other:?}"),
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_dockerfile_builds_the_binary_and_runs_it_as_a_non_root_worker() {
    let text = read("Dockerfile");
    let w = worker();
    let lines: Vec<String> = text
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let of = |kw: &str| -> Vec<&str> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(kw).map(str::trim))
            .collect()
    };
    let froms = of("FROM ");
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    // The build image is the toolchain the repository pins.
    let channel = read("rust-toolchain.toml")
        .lines()
        .find_map(|l| {
            l.strip_prefix("channel = ")
                .map(|c| c.trim_matches('"').to_owned())
        })
        .unwrap();
    let minor: String = channel.split('.').take(2).collect::<Vec<_>>().join(".");
    assert!(
        froms[0].starts_with(&format!("rust:{minor}")),
        "{froms:?} vs {channel}"
    );
    // The runtime stage: the built binary, a non-root user, the worker command.
    let copy = of("COPY --from=build ");
    let binary = copy
        .iter()
        .find_map(|c| {
            c.split_whitespace()
                .nth(1)
                .filter(|d| d.ends_with("/botfleet"))
        })
        .expect("the binary copied from the build stage");
    let user = *of("USER ").last().unwrap();
    assert!(user != "root" && user != "0", "USER {user}");
    let entry: Vec<String> = serde_json::from_str(of("ENTRYPOINT ")[0]).unwrap();
    assert_eq!(entry, [binary.to_owned()]);
    let cmd: Vec<String> = serde_json::from_str(of("CMD ")[0]).unwrap();
    w.check_args(&cmd, "Dockerfile CMD");
    let env: Vec<(String, String)> = of("ENV ")
        .iter()
        .flat_map(|e| e.split_whitespace())
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for (k, _) in &env {
        w.check_var(k, "Dockerfile ENV");
    }
    let port = Worker::http_port(&cmd, &env);
    let hooks = Worker::hooks_port(&cmd, &env);
    assert_eq!(of("EXPOSE "), [format!("{port} {hooks}").as_str()]);
}

#[test]
fn the_compose_file_runs_three_workers_on_redis_and_postgres() {
    let w = worker();
    let doc = &yaml("docker-compose.yml")[0];
    let services = merged(&doc["services"]);
    let names: Vec<String> = services
        .keys()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect();
    assert!(names.contains(&"redis".to_owned()) && names.contains(&"postgres".to_owned()));
    let mut workers = 0;
    let mut ids = HashSet::new();
    let mut hooks_ports = HashSet::new();
    for (name, svc) in &services {
        let svc = merged(svc);
        let cmd = strings(
            svc.get(&Yaml::String("command".into()))
                .unwrap_or(&Yaml::Null),
        );
        if cmd.first().map(String::as_str) != Some("worker") {
            continue;
        }
        workers += 1;
        let whence = format!("docker-compose.yml {}", name.as_str().unwrap());
        w.check_args(&cmd, &whence);
        let env: Vec<(String, String)> = merged(&svc[&Yaml::String("environment".into())])
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().unwrap().to_owned(),
                    v.as_str().map_or_else(|| format!("{v:?}"), str::to_owned),
                )
            })
            .collect();
        for (k, _) in &env {
            w.check_var(k, &whence);
        }
        let var = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        // Redis and Postgres are the services of this file.
        let redis = var("BOTFLEET_REDIS_URL").unwrap();
        assert!(redis.starts_with("redis://redis:"), "{redis}");
        let db = var("BOTFLEET_DATABASE_URL").unwrap();
        assert!(db.contains("@postgres:5432/"), "{db}");
        ids.insert(var("BOTFLEET_WORKER_ID").unwrap());
        let hooks = Worker::hooks_port(&cmd, &env);
        hooks_ports.insert(format!("{name:?}:{hooks}"));
        let port = Worker::http_port(&cmd, &env);
        for p in strings(&svc[&Yaml::String("ports".into())]) {
            assert!(
                p.ends_with(&format!(":{port}")),
                "{whence}: {p} does not reach {port}"
            );
        }
        assert!(
            svc.contains_key(&Yaml::String("stop_grace_period".into())),
            "{whence}"
        );
    }
    assert_eq!(workers, 3);
    assert_eq!(ids.len(), 3, "worker ids are distinct");
    // The load balancer in front of the hooks ports names every worker's.
    let lb = format!(
        "{:?}",
        services
            .get(&Yaml::String("hooks".into()))
            .expect("a hooks load balancer")
    );
    for hp in &hooks_ports {
        let (svc, port) = hp.rsplit_once(':').unwrap();
        let svc = svc
            .trim_matches('"')
            .trim_start_matches("String(\"")
            .trim_end_matches("\")");
        assert!(
            lb.contains(&format!("{svc}:{port}")),
            "the load balancer misses {svc}:{port}"
        );
    }
}

#[test]
fn the_kubernetes_manifests_probe_drain_and_expose_what_the_worker_serves() {
    let w = worker();
    let docs = yaml("deploy/kubernetes/botfleet.yaml");
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(k))
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let dep = kind("Deployment");
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&dep["spec"]["selector"]["matchLabels"], labels);
    let pod = &dep["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    // Above the drain time measured at 10,000 bots (about 2 s) with a wide margin.
    assert!(grace >= 10, "{grace}");
    let c = &pod["containers"][0];
    let args = strings(&c["args"]);
    w.check_args(&args, "Deployment args");
    let mut env = Vec::new();
    for e in c["env"].as_vec().unwrap() {
        let name = e["name"].as_str().unwrap();
        w.check_var(name, "Deployment env");
        env.push((
            name.to_owned(),
            e["value"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    let port = Worker::http_port(&args, &env);
    let http = c["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|p| p["containerPort"].as_i64() == Some(i64::from(port)))
        .expect("the HTTP port is a container port");
    let port_name = http["name"].as_str().unwrap();
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"].as_str(), Some(port_name), "{probe}");
    }
    let pdb = kind("PodDisruptionBudget");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], labels);
    let svc = kind("Service");
    assert_eq!(&svc["spec"]["selector"], labels);
    assert_eq!(
        svc["spec"]["ports"][0]["targetPort"].as_str(),
        Some(port_name)
    );
    // Webhooks: a port of their own and a Service of their own (the only one to publish).
    let hooks = Worker::hooks_port(&args, &env);
    let hooks_name = c["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|p| p["containerPort"].as_i64() == Some(i64::from(hooks)))
        .expect("the hooks port is a container port")["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let hooks_svc = docs
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("Service")
                && d["metadata"]["name"].as_str() == Some("botfleet-hooks")
        })
        .expect("a botfleet-hooks Service");
    assert_eq!(&hooks_svc["spec"]["selector"], labels);
    assert_eq!(
        hooks_svc["spec"]["ports"][0]["targetPort"].as_str(),
        Some(hooks_name.as_str())
    );
}

#[test]
fn the_systemd_unit_runs_an_embedded_worker_from_a_valid_config_file() {
    let w = worker();
    let unit = read("deploy/systemd/botfleet.service");
    let key = |k: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k}"))
            .to_owned()
    };
    let exec: Vec<String> = key("ExecStart")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert!(
        exec[0].starts_with('/') && exec[0].ends_with("/botfleet"),
        "{exec:?}"
    );
    w.check_args(&exec[1..], "ExecStart");
    assert_eq!(key("KillSignal"), "SIGTERM");
    assert!(key("TimeoutStopSec").parse::<u32>().unwrap() >= 10);
    assert!(key("LimitNOFILE").parse::<u64>().unwrap() > 10_000 + 1_000);
    for line in unit.lines().filter_map(|l| l.strip_prefix("Environment=")) {
        w.check_var(line.split('=').next().unwrap(), "Environment");
    }
    // The config file it names is the example shipped beside it, and the binary accepts it.
    let conf = exec
        .iter()
        .position(|a| a == "--config")
        .map(|i| exec[i + 1].clone())
        .unwrap();
    assert!(conf.ends_with("/botfleet.toml"));
    let example = root().join("deploy/botfleet.toml");
    let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .args(["worker", "--help", "--config"])
        .arg(&example)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = read("deploy/botfleet.toml");
    assert!(
        !text
            .lines()
            .any(|l| l.trim_start().starts_with("redis_url")),
        "embedded mode: no Redis"
    );
    // The example's paths match the unit's state directory.
    assert!(
        text.contains(&format!("sqlite://{}/", key("WorkingDirectory"))),
        "{text}"
    );
}
