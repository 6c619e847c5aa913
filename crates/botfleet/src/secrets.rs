//! `botfleet secrets rotate`: re-seal every stored credential under the first secret key.

use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;

use crate::common::Backends;

#[derive(Debug, Subcommand)]
pub(crate) enum SecretsCommand {
    /// Re-encrypt every stored token and signing secret under the first key of
    /// --secret-key-file (or BOTFLEET_SECRET_KEY), opening them with any key listed (and
    /// encrypting ones stored in plain text). Workers keep running and restart nothing; those
    /// reading keys from a file re-read it when they meet the new key. Put the new key first
    /// in every worker's file before, drop the old one after.
    Rotate {
        #[command(flatten)]
        backends: Backends,
    },
}

pub(crate) async fn run(cmd: SecretsCommand) -> anyhow::Result<ExitCode> {
    crate::common::init_logs("warn");
    let SecretsCommand::Rotate { backends } = cmd;
    let keys = backends.keyring()?;
    let Some(first) = keys.key_ids().into_iter().next() else {
        bail!(
            "no secret key: give --secret-key-file (or BOTFLEET_SECRET_KEY) with the new key first and the old ones after it"
        );
    };
    let store = backends.store().await?;
    let n = store.reseal_secrets().await?;
    println!("re-encrypted the credentials of {n} bots under key {first}");
    Ok(ExitCode::SUCCESS)
}
