//! Errors about a value that came from an environment variable (`HASYNC_SEGMENT_SIZE=lots`)
//! name the variable, not the flag the operator never typed. clap reads a flag's variable when
//! the flag is absent and reports a bad value under the flag's name; this finds the variable
//! of that flag (every flag declared with `env`) and rewrites the message when the flag itself
//! is not on the command line.

use std::ffi::OsString;

use clap::CommandFactory as _;
use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The error line for `e` when its bad value came from an environment variable; None when it
/// came from the command line (or is not a bad value).
pub(crate) fn from_environment(
    e: &clap::Error,
    args: impl IntoIterator<Item = OsString>,
) -> Option<String> {
    if !matches!(e.kind(), ErrorKind::ValueValidation | ErrorKind::InvalidValue) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else { return None };
    // "--segment-size <SIZE>" -> "segment-size"
    let long = arg.strip_prefix("--")?.split([' ', '=']).next()?.to_owned();
    let args: Vec<OsString> = args.into_iter().collect();
    let flag = format!("--{long}");
    let on_command_line = args
        .iter()
        .filter_map(|a| a.to_str())
        .any(|a| a == flag || a.strip_prefix(&flag).is_some_and(|rest| rest.starts_with('=')));
    if on_command_line {
        return None;
    }
    let root = crate::cli::Cli::command();
    let var = env_of(used_command(&root, &args), &long)?;
    let value = std::env::var_os(&var)?;
    let reason = match (std::error::Error::source(e), e.get(ContextKind::ValidValue)) {
        (Some(source), _) => source.to_string(),
        (None, Some(ContextValue::Strings(valid))) => {
            format!("expected one of {}", valid.join(", "))
        }
        _ => "not a valid value".to_owned(),
    };
    Some(format!(
        "error: invalid value {:?} in environment variable {var} (the variable of {flag}): \
         {reason}",
        value.to_string_lossy()
    ))
}

/// The (sub)command the arguments name (`hasync serve ...` -> `serve`).
fn used_command<'a>(root: &'a clap::Command, args: &[OsString]) -> &'a clap::Command {
    let mut cmd = root;
    for arg in args.iter().skip(1).filter_map(|a| a.to_str()) {
        match cmd.find_subcommand(arg) {
            Some(sub) => cmd = sub,
            None if arg.starts_with('-') => {}
            None => break,
        }
    }
    cmd
}

/// The environment variable of the flag `--long` of `cmd`.
fn env_of(cmd: &clap::Command, long: &str) -> Option<String> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
}
