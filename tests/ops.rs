//! The operations files in the repository, checked with the tools that
//! consume them: Prometheus's `promtool` for the alert rules, and
//! `docker-compose config` for the compose file. No servers.

mod common;

use std::process::Command;

fn tool(name: &str, package: &str) -> Command {
    assert!(
        Command::new(name).arg("--version").output().is_ok_and(|o| o.status.success()),
        "{name} is missing: apt-get install -y {package} (scripts/test.sh installs it)"
    );
    let mut cmd = Command::new(name);
    cmd.current_dir(common::root());
    cmd
}

#[test]
fn alert_rules_pass_promtool() {
    let out = tool("promtool", "prometheus")
        .args(["check", "rules", "ops/prometheus/cachewright-alerts.yml"])
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("SUCCESS: 11 rules found"), "{said}");
}

#[test]
fn the_dashboard_is_grafana_json_over_documented_metrics() {
    let text = std::fs::read_to_string(common::root().join("ops/grafana/cachewright-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(targets.iter().all(|t| t["expr"].as_str().is_some_and(|e| e.contains("cachewright_"))), "{panel}");
    }
    // Every name the dashboard and rules use is documented in the README.
    let readme = std::fs::read_to_string(common::root().join("README.md")).unwrap();
    for name in common::ops::ops_metric_names() {
        let family = ["_bucket", "_sum", "_count"].iter().fold(name.as_str(), |n, s| n.strip_suffix(s).unwrap_or(n));
        assert!(readme.contains(&format!("`{family}`")), "README does not document {family}");
    }
}

/// The ports `docker-compose config` resolved, one per line.
fn published_ports(config: &str) -> Vec<String> {
    let mut ports = Vec::new();
    let mut in_ports = false;
    for line in config.lines() {
        let trimmed = line.trim_start();
        if trimmed == "ports:" {
            in_ports = true;
        } else if in_ports && trimmed.starts_with("- ") {
            ports.push(trimmed[2..].trim_matches('\'').to_string());
        } else {
            in_ports = false;
        }
    }
    ports
}

#[test]
fn compose_validates_and_publishes_on_loopback_only() {
    let out = tool("docker-compose", "docker-compose")
        .args(["--env-file", ".env.example", "-f", "docker-compose.yml", "config"])
        .output()
        .unwrap();
    let config = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ports = published_ports(&config);
    assert_eq!(ports.len(), 3, "mongo, redis and cachewright publish one port each: {ports:?}\n{config}");
    for port in &ports {
        assert!(port.starts_with("127.0.0.1:"), "{port} is published beyond loopback");
    }
    // Redis and MongoDB run with authentication.
    assert!(config.contains("MONGO_INITDB_ROOT_PASSWORD") && config.contains("--keyFile"), "{config}");
    assert!(config.contains("REDIS_URL: redis://cachewright:"), "{config}");

    // Without the secrets compose refuses, naming the one to set.
    let empty = tempfile::NamedTempFile::new().unwrap();
    let out = tool("docker-compose", "docker-compose")
        .args(["--env-file", empty.path().to_str().unwrap(), "-f", "docker-compose.yml", "config"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in .env"), "{}", String::from_utf8_lossy(&out.stderr));
    let ignored = std::fs::read_to_string(common::root().join(".gitignore")).unwrap();
    assert!(ignored.lines().any(|l| l == ".env"), ".env must be git-ignored");
}

/// The compose Redis, the deployment guide and `cachewright acl` give
/// one and the same rule.
#[test]
fn the_documented_acl_is_the_generated_one() {
    let rule = cachewright::sink::acl::rule("cachewright", "<password>", "app:", "cachewright:");
    let guide = std::fs::read_to_string(common::root().join("docs/DEPLOYMENT.md")).unwrap();
    assert!(guide.contains(&rule), "docs/DEPLOYMENT.md lacks the rule:\n{rule}");
    let compose_rule = rule.replace("ACL SETUSER ", "user ").replace("<password>", "${REDIS_CACHEWRIGHT_PASSWORD}");
    let script = std::fs::read_to_string(common::root().join("ops/compose/redis-start.sh")).unwrap();
    assert!(script.lines().any(|l| l == compose_rule), "ops/compose/redis-start.sh lacks:\n{compose_rule}");
}
