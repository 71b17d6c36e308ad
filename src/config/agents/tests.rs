//! Unit tests of the agents of a configuration: the `--agent` forms, the `[agents.NAME]`
//! tables, the default, `${VAR}` references and what the log shows.

use std::path::PathBuf;

use super::*;

/// A configuration from `args`, with `file` (when not empty) as its --config file.
fn load(file: &str, args: &[&str]) -> anyhow::Result<Config> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let mut all = vec!["acp-gateway".to_owned()];
    if !file.is_empty() {
        std::fs::write(&path, file).unwrap();
        all.extend(["--config".to_owned(), path.display().to_string()]);
    }
    all.extend(args.iter().map(|a| a.to_string()));
    Config::load_from(all)
}

fn agents(file: &str, args: &[&str]) -> anyhow::Result<(Vec<AgentSpec>, String)> {
    let env = |name: &str| match name {
        "OPENAI_API_KEY" => Some("sk-openai".to_owned()),
        "GEMINI_API_KEY" => Some("gm-key".to_owned()),
        _ => None,
    };
    load(file, args)?.agents_with(env)
}

fn names(specs: &[AgentSpec]) -> Vec<&str> {
    specs.iter().map(|s| s.name.as_str()).collect()
}

fn error(result: anyhow::Result<impl std::fmt::Debug>) -> String {
    format!("{:#}", result.unwrap_err())
}

#[test]
fn a_plain_agent_is_named_default_and_is_the_default() {
    let (specs, default) =
        agents("", &["--agent", "npx -y claude-acp", "--pool-size", "3"]).unwrap();
    assert_eq!(default, "default");
    assert_eq!(names(&specs), ["default"]);
    let spec = &specs[0];
    assert_eq!(spec.command.program, "npx");
    assert_eq!(spec.command.args, ["-y", "claude-acp"]);
    assert_eq!(spec.pool_size, 3);
    assert_eq!(
        (
            spec.auth_method.clone(),
            spec.auth_meta.clone(),
            spec.max_sessions
        ),
        (None, None, 0)
    );
}

#[test]
fn named_and_plain_agents_mix_and_the_plain_one_is_the_default() {
    let args = [
        "--agent",
        "zed=zed-agent --acp",
        "--agent",
        "/bin/echo-agent -v",
        "--agent",
        "codex=npx codex-acp",
    ];
    let (specs, default) = agents("", &args).unwrap();
    assert_eq!(default, "default");
    assert_eq!(
        names(&specs),
        ["default", "codex", "zed"],
        "the default first, then by name"
    );
    assert_eq!(specs[0].command.program, "/bin/echo-agent");
    assert_eq!(specs[2].command.args, ["--acp"]);
}

#[test]
fn a_single_named_agent_is_the_default() {
    let (specs, default) = agents("", &["--agent", "gemini=gemini --acp"]).unwrap();
    assert_eq!(
        (names(&specs), default.as_str()),
        (vec!["gemini"], "gemini")
    );
    assert_eq!(specs[0].command.program, "gemini");
}

#[test]
fn a_value_is_named_only_by_a_valid_name_before_a_command() {
    for plain in [
        "FOO=bar agent",
        "my agent=x",
        "name=",
        "name=  ",
        "-x=agent",
        "/usr/bin/a=b",
    ] {
        let (specs, _) = agents("", &[&format!("--agent={plain}")]).unwrap();
        assert_eq!(names(&specs), ["default"], "{plain:?} is a plain command");
    }
    let long = format!("{}=agent", "a".repeat(63));
    assert_eq!(
        names(&agents("", &["--agent", &long]).unwrap().0),
        [&long[..63]]
    );
    let too_long = format!("{}=agent", "a".repeat(64));
    assert_eq!(
        names(&agents("", &["--agent", &too_long]).unwrap().0),
        ["default"]
    );
}

#[test]
fn two_plain_commands_or_a_name_used_twice_are_refused() {
    let two = error(agents("", &["--agent", "a-agent", "--agent", "b-agent"]));
    assert!(two.contains("two plain command lines"), "{two}");
    let twice = error(agents("", &["--agent", "x=a", "--agent", "x=b"]));
    assert!(twice.contains("\"x\" is used twice"), "{twice}");
    let default = error(agents("", &["--agent", "a-agent", "--agent", "default=b"]));
    assert!(default.contains("\"default\" is used twice"), "{default}");
}

#[test]
fn the_default_is_chosen_by_flag_or_by_name_or_refused() {
    let (specs, default) = agents(
        "",
        &["--agent", "a=x", "--agent", "b=y", "--default-agent", "b"],
    )
    .unwrap();
    assert_eq!((names(&specs), default.as_str()), (vec!["b", "a"], "b"));
    let named = agents("", &["--agent", "a=x", "--agent", "default=y"]).unwrap();
    assert_eq!(named.1, "default");
    let unnamed = error(agents("", &["--agent", "a=x", "--agent", "b=y"]));
    assert!(
        unnamed.contains("several agents are configured (a, b)")
            && unnamed.contains("--default-agent"),
        "{unnamed}"
    );
    let unknown = error(agents(
        "",
        &["--agent", "a=x", "--agent", "b=y", "--default-agent", "c"],
    ));
    assert!(
        unknown.contains("--default-agent \"c\" is not a configured agent; the agents are: a, b"),
        "{unknown}"
    );
    let alone = error(agents("", &["--agent", "a=x", "--default-agent", "c"]));
    assert!(alone.contains("not a configured agent"), "{alone}");
    let none = error(agents("", &[]));
    assert!(none.contains("no agent configured"), "{none}");
    let file = agents("default-agent = \"b\"\nagent = [\"a=x\", \"b=y\"]\n", &[]).unwrap();
    assert_eq!(file.1, "b", "both may come from the file");
}

const FILE: &str = r#"
pool-size = 2
agent-env = ["GLOBAL=1"]
agent-cwd = "/srv/global"
agent-auth-method = "global-login"

[agents.codex]
command = "npx -y @zed-industries/codex-acp"
pool-size = 3
env = { CODEX_HOME = "/srv/codex", OPENAI_BASE = "https://example.org" }
cwd = "/srv/agents"
auth-method = "api-key"
auth-meta = { "api-key" = { apiKey = "${OPENAI_API_KEY}" } }
max-sessions = 10

[agents.gemini]
command = "gemini --acp"
auth_method = "gemini-api-key"
auth_meta = { "api-key" = "${GEMINI_API_KEY}", note = "key ${GEMINI_API_KEY} of ${OPENAI_API_KEY}", n = 1, list = ["${GEMINI_API_KEY}", true] }

[agents.plain]
command = "plain-agent"
"#;

#[test]
fn file_tables_set_their_own_settings_and_take_the_global_ones_otherwise() {
    let (specs, default) = agents(
        FILE,
        &["--default-agent", "gemini", "--max-line-bytes", "1000"],
    )
    .unwrap();
    assert_eq!(
        (names(&specs), default.as_str()),
        (vec!["gemini", "codex", "plain"], "gemini")
    );
    let [gemini, codex, plain] = &specs[..] else {
        unreachable!()
    };

    assert_eq!(codex.command.program, "npx");
    assert_eq!(codex.command.args, ["-y", "@zed-industries/codex-acp"]);
    assert_eq!(codex.pool_size, 3);
    assert_eq!(
        codex.command.env,
        [
            ("CODEX_HOME".to_owned(), "/srv/codex".to_owned()),
            ("OPENAI_BASE".to_owned(), "https://example.org".to_owned())
        ],
        "its own environment replaces --agent-env"
    );
    assert_eq!(codex.command.cwd, Some(PathBuf::from("/srv/agents")));
    assert_eq!(codex.auth_method.as_deref(), Some("api-key"));
    assert_eq!(
        codex.auth_meta,
        Some(serde_json::json!({"api-key": {"apiKey": "sk-openai"}}))
    );
    assert_eq!(codex.max_sessions, 10);
    assert_eq!(codex.command.max_line_bytes, 1000);

    assert_eq!(
        gemini.auth_method.as_deref(),
        Some("gemini-api-key"),
        "`_` spellings too"
    );
    assert_eq!(
        gemini.auth_meta,
        Some(
            serde_json::json!({"api-key": "gm-key", "note": "key gm-key of sk-openai", "n": 1, "list": ["gm-key", true]})
        )
    );

    assert_eq!(plain.pool_size, 2);
    assert_eq!(plain.command.env, [("GLOBAL".to_owned(), "1".to_owned())]);
    assert_eq!(plain.command.cwd, Some(PathBuf::from("/srv/global")));
    assert_eq!(plain.auth_method.as_deref(), Some("global-login"));
    assert_eq!((plain.auth_meta.clone(), plain.max_sessions), (None, 0));
    assert_eq!(plain.command.max_line_bytes, 1000);
}

#[test]
fn flags_and_file_tables_combine_but_share_their_names() {
    let file = "[agents.claude]\ncommand = \"claude-acp\"\n";
    let (specs, default) = agents(file, &["--agent", "echo-agent"]).unwrap();
    assert_eq!(
        (names(&specs), default.as_str()),
        (vec!["default", "claude"], "default")
    );
    let both = error(agents(file, &["--agent", "claude=other"]));
    assert!(both.contains("\"claude\" is used twice"), "{both}");
    let plain = error(agents(
        "[agents.default]\ncommand = \"a\"\n",
        &["--agent", "b"],
    ));
    assert!(plain.contains("\"default\" is used twice"), "{plain}");
}

#[test]
fn bad_names_and_bad_tables_are_refused() {
    for name in ["Claude", "-x", "_x", "a.b", "ünï", &"a".repeat(64)] {
        let file = format!("[agents.\"{name}\"]\ncommand = \"a\"\n");
        let bad = error(agents(&file, &[]));
        assert!(bad.contains("is not a valid agent name"), "{name}: {bad}");
    }
    let unknown = error(agents("[agents.a]\ncommand = \"a\"\npool-sise = 2\n", &[]));
    assert!(
        unknown.contains("[agents.a]") && unknown.contains("pool-sise"),
        "{unknown}"
    );
    let no_command = error(agents("[agents.a]\npool-size = 2\n", &[]));
    assert!(no_command.contains("command"), "{no_command}");
    let pool = error(agents("[agents.a]\ncommand = \"a\"\npool-size = 0\n", &[]));
    assert!(pool.contains("pool-size must be 1 to 256"), "{pool}");
    let meta = error(agents(
        "[agents.a]\ncommand = \"a\"\nauth-meta = { k = \"v\" }\n",
        &[],
    ));
    assert!(
        meta.contains("auth-meta") && meta.contains("needs auth-method"),
        "{meta}"
    );
    let not_table = error(agents("agents = \"a\"\n", &[]));
    assert!(not_table.contains("agents must be a table"), "{not_table}");
}

#[test]
fn auth_meta_names_an_unset_or_malformed_reference() {
    let file = |value: &str| {
        format!(
            "[agents.a]\ncommand = \"a\"\nauth-method = \"k\"\nauth-meta = {{ k = {{ deep = \"{value}\" }} }}\n"
        )
    };
    let unset = error(agents(&file("${ANTHROPIC_API_KEY}"), &[]));
    assert!(
        unset.contains("[agents.a]")
            && unset.contains("the environment variable ANTHROPIC_API_KEY is not set"),
        "{unset}"
    );
    for bad in ["${OPENAI_API_KEY", "${}", "${1X}", "x ${A B}"] {
        let malformed = error(agents(&file(bad), &[]));
        assert!(
            malformed.contains("must be followed by an environment variable's name"),
            "{bad}: {malformed}"
        );
    }
    let (specs, _) = agents(&file("$OPENAI_API_KEY and $${OPENAI_API_KEY}"), &[]).unwrap();
    assert_eq!(
        specs[0].auth_meta,
        Some(serde_json::json!({"k": {"deep": "$OPENAI_API_KEY and $sk-openai"}}))
    );
}

#[test]
fn the_logged_configuration_shows_no_environment_values_or_auth_meta() {
    let config = load(
        FILE,
        &["--default-agent", "gemini", "--agent", "claude=claude-acp"],
    )
    .unwrap();
    let shown = format!("{:?}", config.effective);
    for secret in [
        "/srv/codex",
        "example.org",
        "${OPENAI_API_KEY}",
        "${GEMINI_API_KEY}",
        "key ",
        "GLOBAL=1",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    let get = |k: &str| {
        let (_, v) = config
            .effective
            .iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("no {k} in {shown}"));
        serde_json::from_str::<Value>(v).unwrap_or_else(|_| Value::String(v.clone()))
    };
    assert_eq!(
        get("agents.codex"),
        serde_json::json!({
            "command": "npx -y @zed-industries/codex-acp", "pool-size": 3,
            "env": {"CODEX_HOME": "<redacted>", "OPENAI_BASE": "<redacted>"}, "cwd": "/srv/agents",
            "auth-method": "api-key", "auth-meta": {"api-key": {"apiKey": "<redacted>"}}, "max-sessions": 10
        })
    );
    assert_eq!(
        get("agents.gemini")["auth-meta"],
        serde_json::json!({"api-key": "<redacted>", "note": "<redacted>", "n": 1, "list": ["<redacted>", true]})
    );
    assert_eq!(get("agent"), "claude=claude-acp");
    assert_eq!(get("default-agent"), "gemini");
}

#[test]
fn an_agent_given_by_url_is_bridged_with_its_token_and_nothing_of_the_gateways() {
    let file = "[agents.far]\nurl = \"https://host.example/acp\"\ntoken = \"${OPENAI_API_KEY}\"\nheartbeat = 3\npool-size = 2\n";
    let args = [
        "--agent",
        "near=wss://near.example/acp",
        "--default-agent",
        "near",
    ];
    let (specs, _) = agents(file, &args).unwrap();
    let exe = std::env::current_exe().unwrap().display().to_string();
    let far = specs.iter().find(|s| s.name == "far").unwrap();
    assert_eq!(far.remote, ["https://host.example/acp"]);
    assert_eq!(far.command.program, exe);
    assert_eq!(
        far.command.args,
        [
            "connect",
            "--once",
            "--exact-url",
            "--heartbeat",
            "3",
            "--max-line-bytes",
            "67108864",
            "https://host.example/acp"
        ]
    );
    assert_eq!(
        far.command.env,
        [(
            "ACP_GATEWAY_CONNECT_TOKEN".to_owned(),
            "sk-openai".to_owned()
        )]
    );
    assert_eq!(far.pool_size, 2);
    let near = specs.iter().find(|s| s.name == "near").unwrap();
    assert_eq!(near.command.args[4], "10");
    assert_eq!(near.command.args[7], "wss://near.example/acp");
    assert!(near.command.env.is_empty(), "{:?}", near.command.env);
    // A command line is still a command, even with a scheme-like word in it.
    let (specs, _) = agents("", &["--agent", "tool --url https://x"]).unwrap();
    assert_eq!(specs[0].command.program, "tool");
    assert!(specs[0].remote.is_empty());
    // Several hosts: a member for each at least, the first URL in the command.
    let hosts = "[agents.h]\nurl = [\"wss://a/acp\", \"wss://b/acp\", \"wss://c/acp\"]\n";
    let (specs, _) = agents(hosts, &[]).unwrap();
    assert_eq!(
        specs[0].remote,
        ["wss://a/acp", "wss://b/acp", "wss://c/acp"]
    );
    assert_eq!(specs[0].pool_size, 3);
    assert_eq!(specs[0].command.args[7], "wss://a/acp");
    let (specs, _) = agents("", &["--agent", "wss://a/acp wss://b/acp"]).unwrap();
    assert_eq!(specs[0].remote, ["wss://a/acp", "wss://b/acp"]);
}

#[test]
fn a_url_table_is_refused_with_what_belongs_to_commands_and_the_other_way_round() {
    for (table, says) in [
        ("command = \"a\"\nurl = \"wss://h/acp\"", "either command"),
        ("pool-size = 1", "either command"),
        ("url = \"ftp://h/acp\"", "url must start with"),
        ("url = [\"wss://h/acp\", \"h\"]", "url must start with"),
        ("url = []", "url must start with"),
        ("url = \"wss://h/acp\"\ncwd = \"/srv\"", "env and cwd"),
        ("command = \"a\"\ntoken = \"t\"", "token and heartbeat"),
        (
            "url = \"wss://h/acp\"\ntoken = \"${NOPE}\"",
            "NOPE is not set",
        ),
    ] {
        let refused = error(agents(&format!("[agents.a]\n{table}\n"), &[]));
        assert!(refused.contains(says), "{table}: {refused}");
    }
}

#[test]
fn the_two_tier_overlays_front_configuration_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/kubernetes/overlays/two-tier/front-agents.toml"
    );
    let file = std::fs::read_to_string(path).unwrap();
    let env = |name: &str| (name == "HOST_TOKEN").then(|| "host-key-0123456789".to_owned());
    let (specs, default) = load(&file, &[]).unwrap().agents_with(env).unwrap();
    assert_eq!(default, "host-0");
    assert_eq!(names(&specs), ["host-0", "host-1"]);
    assert!(error(agents("", &["--agent", " "])).contains("no agent configured"));
    // The image's default agent is cleared by an empty value.
    let (specs, _) = load(&file, &["--agent", ""])
        .unwrap()
        .agents_with(env)
        .unwrap();
    for (i, spec) in specs.iter().enumerate() {
        let url = format!("ws://acp-agent-host-{i}.acp-agent-host:8080/acp");
        assert_eq!(spec.remote, [url]);
        let token = (
            "ACP_GATEWAY_CONNECT_TOKEN".to_owned(),
            "host-key-0123456789".to_owned(),
        );
        assert_eq!(spec.command.env, [token]);
    }
}
