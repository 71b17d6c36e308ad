//! `${NAME}` in the text of a configuration value, replaced by the gateway's environment
//! variable NAME (an agent's `auth-meta` and `token`, a tenant's `env`).

use anyhow::Context;

/// `text` with every `${NAME}` replaced by `env(NAME)`; an unset variable, or a `${` not
/// followed by a name and `}`, is an error.
pub(super) fn substitute(
    text: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let name = after
            .find('}')
            .map(|end| &after[..end])
            .filter(|n| is_variable_name(n))
            // A typo must not send `${OPENAI_API_KEY` as the key.
            .context("`${` must be followed by an environment variable's name and `}`")?;
        let value =
            env(name).with_context(|| format!("the environment variable {name} is not set"))?;
        out.push_str(&value);
        rest = &after[name.len() + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn is_variable_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}
