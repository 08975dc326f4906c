//! The credential the agents see: never the user's own. The plugin asks the API server, with the
//! user's kubeconfig, for a token of the agents' reader ServiceAccount (`lifecycle-reader` in
//! the agents' namespace, bound to `lifecycle-api-reader`) through a TokenRequest, bound to the
//! agents' audience (`lifecycle-agent`) and valid ten minutes (the API server's shortest). The
//! agents run with `--api-auth-audience lifecycle-agent`: that token is all they take, and it is
//! worth nothing against the API server, whoever on a node catches it.
//!
//! The user needs `create serviceaccounts/token` on that one account (deploy/rbac.yaml's
//! `lifecycle-plugin-user` Role), which the API server checks with the user's own identity.

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
use kube::{api::PostParams, Api, Client};

/// Where and for whom the token is minted.
#[derive(Clone, Debug)]
pub struct Minting {
    /// The agents' namespace, where the reader account is.
    pub namespace: String,
    /// The reader ServiceAccount.
    pub account: String,
    /// The audience the agents require (`--api-auth-audience`).
    pub audience: String,
}

/// The token's life: the shortest the API server grants (it raises anything shorter to this).
pub const TOKEN_SECONDS: i64 = 600;

/// Why no token could be minted.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The API server refused or failed the TokenRequest: its words (the whole chain, on one
    /// line: `cluster::words`) and its status code.
    #[error("cannot mint a token of {namespace}/{account} for audience {audience}: {said}{}", hint(*.code))]
    Refused { namespace: String, account: String, audience: String, said: String, code: Option<u16> },
    /// The API server answered without a token.
    #[error("the API server minted no token of {namespace}/{account}")]
    Empty { namespace: String, account: String },
}

/// What to do when the API server refuses.
fn hint(code: Option<u16>) -> &'static str {
    match code {
        Some(403) => {
            " (you need `create serviceaccounts/token` on that account: the lifecycle-plugin-user Role in \
             deploy/rbac.yaml, bound in the agents' namespace)"
        }
        Some(404) => " (no such account: apply deploy/rbac.yaml or the chart, or name yours with --reader-account)",
        _ => "",
    }
}

/// A token of the reader account for the agents' audience, minted with the user's identity.
pub async fn mint(client: &Client, minting: &Minting) -> Result<String, TokenError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &minting.namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![minting.audience.clone()]),
            expiration_seconds: Some(TOKEN_SECONDS),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let minted =
        accounts.create_token_request(&minting.account, &PostParams::default(), &request).await.map_err(|source| {
            TokenError::Refused {
                namespace: minting.namespace.clone(),
                account: minting.account.clone(),
                audience: minting.audience.clone(),
                said: crate::cluster::words(&source),
                code: crate::cluster::code(&source),
            }
        })?;
    match minted.status.and_then(|status| status.token) {
        Some(token) if !token.is_empty() => Ok(token),
        _ => Err(TokenError::Empty { namespace: minting.namespace.clone(), account: minting.account.clone() }),
    }
}
