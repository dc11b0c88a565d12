//! The `cachewright` binary as an operator uses it: help, exit codes,
//! error messages, summaries. Real servers from the shared harness.

mod common;

use std::process::{Command, Output};

fn cachewright(args: &[&str], env: &[(&str, &str)]) -> Output {
    run(env!("CARGO_BIN_EXE_cachewright"), args, env)
}

fn cachewright_dev(args: &[&str], env: &[(&str, &str)]) -> Output {
    run(env!("CARGO_BIN_EXE_cachewright-dev"), args, env)
}

fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(args).env_remove("RUST_LOG");
    for var in [
        "MONGODB_URI",
        "MONGODB_DB",
        "REDIS_URL",
        "REDIS_PASSWORD",
        "REDIS_DB",
        "CACHEWRIGHT_PREFIX",
        "CACHEWRIGHT_CONFIG",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run cachewright")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[test]
fn every_command_has_help() {
    for args in [vec!["--help"], vec!["rebuild", "--help"], vec!["keys", "--help"], vec!["serve", "--help"]] {
        let out = cachewright(&args, &[]);
        assert!(out.status.success(), "{args:?}");
        assert!(text(&out.stdout).contains("Usage: cachewright"), "{args:?}");
    }
    let out = cachewright(&["--help"], &[]);
    assert!(text(&out.stdout).contains("Exit codes"));
    for args in [vec!["fixtures", "generate", "--help"], vec!["bench", "--help"]] {
        let out = cachewright_dev(&args, &[]);
        assert!(out.status.success(), "{args:?}");
        assert!(text(&out.stdout).contains("--yes"), "{args:?}");
    }
}

/// The product binary has no tool that drops or rewrites collections.
#[test]
fn dev_tools_are_not_in_the_product_binary() {
    for command in ["fixtures", "bench"] {
        let out = cachewright(&[command, "--help"], &[]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        assert!(text(&out.stderr).contains("unrecognized subcommand"), "{}", text(&out.stderr));
    }
}

/// The development tools refuse a database holding documents unless
/// given `--yes`, and then do their job.
#[test]
fn dev_tools_refuse_existing_data_without_yes() {
    let s = common::shared();
    let name = common::unique("clidev");
    let env =
        [("MONGODB_URI", s.mongo.uri()), ("MONGODB_DB", name.clone()), ("CACHEWRIGHT_PREFIX", format!("{name}:"))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let fixtures = common::fixture_dir("edge-cases");
    let fixtures = fixtures.to_str().unwrap();
    let first = cachewright_dev(&["fixtures", "load", fixtures], &env);
    assert_eq!(first.status.code(), Some(0), "an empty database needs no --yes: {}", text(&first.stderr));
    for args in [
        vec!["fixtures", "load", fixtures],
        vec!["fixtures", "generate", "--videos", "10"],
        vec!["bench"],
        vec!["bench", "--watch"],
    ] {
        let out = cachewright_dev(&args, &env);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("pass --yes"), "{}", text(&out.stderr));
    }
    let out = cachewright_dev(
        &["fixtures", "generate", "--yes", "--videos", "10", "--channels", "2", "--categories", "3", "--tags", "5"],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// The benchmark's reader times `GET`s against a real Redis until its
/// file appears (checked every 256 requests) or its time is up, and
/// reports percentiles that are ordered and in milliseconds.
#[test]
fn the_dev_reader_times_gets_until_told_to_stop() {
    let s = common::shared();
    let key = common::unique("reader");
    let addr = format!("127.0.0.1:{}", s.redis.port);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut conn = common::redis_conn(&s.redis.url()).await;
        let _: () = redis::cmd("SET").arg(&key).arg("a value").query_async(&mut conn).await.unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    std::fs::write(&stop, "").unwrap();
    let stop = stop.to_str().unwrap();
    let report = |args: &[&str]| -> serde_json::Value {
        let out = cachewright_dev(&[&["reader", "--addr", &addr][..], args].concat(), &[]);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    };
    // The file is there before the first check: one round of requests.
    let once = report(&["--key", &key, "--until-file", stop]);
    assert_eq!(once["requests"], 256, "{once}");
    // A key that is missing reads as nil, which the reader takes too.
    let timed = report(&["--key", &format!("{key}-missing"), "--seconds", "0.3"]);
    assert!(timed["requests"].as_u64().unwrap() >= 256, "{timed}");
    assert!(timed["seconds"].as_f64().unwrap() >= 0.3, "{timed}");
    for r in [&once, &timed] {
        let ms: Vec<f64> = ["p50_ms", "p99_ms", "p99_9_ms", "max_ms"].iter().map(|f| r[f].as_f64().unwrap()).collect();
        assert!(ms[0] > 0.0 && ms.windows(2).all(|w| w[0] <= w[1]), "ordered percentiles: {r}");
        assert!(ms[3] < 30_000.0, "milliseconds, not nanoseconds: {r}");
    }
    let refused = cachewright_dev(&["reader", "--addr", "127.0.0.1:1", "--key", "k", "--seconds", "1"], &[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("reading k from 127.0.0.1:1 failed"), "{}", text(&refused.stderr));
}

#[test]
fn keys_prints_the_registry_in_three_formats() {
    let out = cachewright(&["keys", "--format", "json"], &[]);
    assert!(out.status.success());
    let items: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(items.len(), 20);
    assert!(items.iter().any(|i| i["pattern"] == "video:category:index:{categoryId}:videos" && i["type"] == "zset"));
    let table = text(&cachewright(&["keys"], &[]).stdout);
    assert!(table.contains("tag:search:{prefix}"));
    let md = text(&cachewright(&["keys", "--format", "markdown"], &[]).stdout);
    assert!(md.starts_with("# Cache semantics") && md.contains("| `tag:search` |"), "{md}");
}

#[test]
fn bad_configuration_exits_2_with_a_fix_and_no_password() {
    let out = cachewright(&["rebuild"], &[("CACHEWRIGHT_TTL_JITTER", "lots")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("CACHEWRIGHT_TTL_JITTER = \"lots\" is invalid: use a fraction"),
        "{}",
        text(&out.stderr)
    );

    let out = cachewright(&["rebuild"], &[("REDIS_URL", "http://user:hunter2@example")]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("REDIS_URL") && !err.contains("hunter2"), "{err}");

    let out = cachewright(&["rebuild", "--only", "nope"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown family `nope`"));

    let out = cachewright(&["rebuild", "--no-such-flag"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn unreachable_mongodb_fails_with_exit_1_and_says_what_to_check() {
    let s = common::shared();
    let uri = "mongodb://user:s3cret@127.0.0.1:9/?serverSelectionTimeoutMS=300&connectTimeoutMS=300";
    let status_prefix = format!("cw-{}:", common::unique("unreachable"));
    let env = [("MONGODB_URI", uri), ("REDIS_URL", &s.redis.url()), ("CACHEWRIGHT_STATUS_PREFIX", &status_prefix)];
    let out = cachewright(&["rebuild"], &env);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("cannot connect to MongoDB") && err.contains("check MONGODB_URI"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}

#[test]
fn strict_rebuild_with_rejections_exits_3_after_writing_and_summarising() {
    let s = common::shared();
    let name = common::unique("cli");
    let cfg = common::TestEnv::named(&name).config();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")));
    let env = [
        ("MONGODB_URI", s.mongo.uri()),
        ("MONGODB_DB", name.clone()),
        ("REDIS_URL", s.redis.url()),
        ("CACHEWRIGHT_PREFIX", cfg.prefix.clone()),
        ("CACHEWRIGHT_STATUS_PREFIX", cfg.status_prefix.clone()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let dry = cachewright(&["rebuild", "--dry-run"], &env);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry.stderr));
    let summary = text(&dry.stdout);
    assert!(summary.contains("would write") && summary.contains("dry run: nothing written"), "{summary}");
    assert!(rt.block_on(common::dump(&s.redis.url(), &cfg.prefix)).is_empty());

    let out = cachewright(&["rebuild", "--strict"], &env);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    // Logs to a pipe carry no terminal colour codes.
    let log = text(&out.stderr);
    assert!(log.contains("INFO") && !log.contains('\u{1b}'), "{log}");
    let summary = text(&out.stdout);
    for part in
        ["video:detail", "VideoMedia", "duplicate id: 1 (e.g. 65a1b2c3d4e5f6a7b8c9d0e3)", "missing title", "dangling"]
    {
        assert!(summary.contains(part), "summary lacks {part:?}:\n{summary}");
    }
    assert!(!rt.block_on(common::dump(&s.redis.url(), &cfg.prefix)).is_empty());
    let out = cachewright(&["rebuild"], &env);
    assert_eq!(out.status.code(), Some(0));
}

/// The README's settings tables are the declarations themselves: one
/// table from `config::SETTINGS` (file, environment, flag), one from the
/// `serve` arguments.
#[test]
fn readme_tables_match_the_declared_settings() {
    let readme = std::fs::read_to_string(common::root().join("README.md")).unwrap();
    for (what, table) in
        [("configuration", cachewright::config::markdown_table()), ("serve", cachewright::cli::serve_settings_table())]
    {
        assert!(readme.contains(&table), "README's {what} table is out of date; it should read:\n{table}");
    }
}

/// Each setting reaches the configuration from its flag, its environment
/// variable and its file key alike.
#[test]
fn every_setting_works_as_flag_environment_and_file_key() {
    use cachewright::config::{Config, RawConfig, SETTINGS};
    use clap::Parser;
    let dir = tempfile::tempdir().unwrap();
    for s in SETTINGS {
        // A value that validates and differs from the default.
        let value = match s.field {
            "mongodb_uri" => "mongodb://db.example:27017",
            "redis_url" => "rediss://cache.example:6380",
            "redis_tls_ca" | "redis_tls_cert" | "redis_tls_key" => "/etc/cachewright/x.pem",
            "prefix" => "site:",
            "status_prefix" => "cwstatus:",
            "ttl_jitter" | "sweep_max_share" => "0.25",
            "tag_search_lengths" => "4",
            "mongodb_db" | "redis_password" => "other",
            "redis_cluster" => "true",
            "redis_cluster_nodes" => "10.0.0.2:6379,10.0.0.3:6379",
            "redis_sentinels" => "10.0.0.5:26379,10.0.0.6:26379",
            "redis_sentinel_master" => "cache",
            "redis_allow_eviction" => "true",
            "redis_restore" => "false",
            f if f.starts_with("collection_") => "Renamed",
            _ => "17",
        };
        let toml_value = match s.field {
            "tag_search_lengths" => "[4]".to_string(),
            "ttl_jitter"
            | "sweep_max_share"
            | "redis_db"
            | "home_limit"
            | "read_batch_size"
            | "read_cursors"
            | "write_batch_ops"
            | "write_batch_cost"
            | "write_concurrency"
            | "lease_seconds"
            | "watch_max_lag_seconds"
            | "drift_sample_per_minute"
            | "redis_timeout_seconds"
            | "mongodb_timeout_seconds"
            | "redis_allow_eviction"
            | "redis_restore"
            | "redis_cluster" => value.to_string(),
            f if f.starts_with("ttl_") => value.to_string(),
            _ => format!("{value:?}"),
        };
        let toml = match s.key.split_once('.') {
            Some((section, key)) => format!("[{section}]\n{key} = {toml_value}\n"),
            None => format!("{} = {toml_value}\n", s.key),
        };
        let file = dir.path().join(format!("{}.toml", s.field));
        std::fs::write(&file, toml).unwrap();
        let flag = format!("--{}={value}", s.flag());
        let cli = cachewright::cli::Cli::try_parse_from(["cachewright", &flag, "keys"])
            .unwrap_or_else(|e| panic!("{flag}: {e}"));
        let pair_tls = |raw: RawConfig| match s.field {
            // A client certificate needs its key, and TLS files a rediss:// URL.
            "redis_tls_cert" | "redis_tls_key" | "redis_tls_ca" => RawConfig {
                redis_tls_cert: raw.redis_tls_cert.clone().or(raw.redis_tls_key.clone()),
                redis_tls_key: raw.redis_tls_key.clone().or(raw.redis_tls_cert.clone()),
                redis_url: Some("rediss://cache.example:6380".into()),
                ..raw
            },
            _ => raw,
        };
        let from_flag = Config::from_raw(pair_tls(cli.global.raw_config())).expect(&flag);
        let from_env =
            Config::from_raw(pair_tls(RawConfig::from_env(|k| (k == s.env).then(|| value.to_string())).unwrap()))
                .expect(s.env);
        let from_file = Config::from_raw(pair_tls(RawConfig::from_file(&file).unwrap())).expect(s.key);
        let default = Config::from_raw(pair_tls(RawConfig::default())).unwrap();
        assert!(from_flag == from_env && from_env == from_file, "{}: flag, environment and file disagree", s.field);
        assert!(from_flag != default, "{}: the value {value} did not arrive", s.field);
    }
}
