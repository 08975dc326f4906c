//! Who is asking, and may they: a bearer token checked with a `TokenReview`, then the user it
//! names checked with a `SubjectAccessReview` for what the request reads, as resource attributes
//! of the API group `lifecycle.dev` ([`AccessRequest`]). The same two calls kube-rbac-proxy and
//! the kubelet's own authenticated endpoints make; the API server's authenticators and
//! authorizers decide, the agent keeps no policy of its own.
//!
//! Why resources and not the request's path as a non-resource URL: the agent's paths start with
//! `/api/`, and every Kubernetes cluster grants `get` on the non-resource URLs `/api/*` to all
//! authenticated users (the `system:discovery` role): any pod's service-account token would pass.
//! A real kube-apiserver 1.20 allowed exactly that in the kubelet tier. Resource attributes of a
//! group no API serves are granted by nothing but the roles that name them, and they can be
//! namespaced: a Role in a team's namespace can grant `probes` for that namespace alone.
//!
//! Needs `create` on `tokenreviews` (authentication.k8s.io) and `subjectaccessreviews`
//! (authorization.k8s.io): the rules of the built-in `system:auth-delegator` role.

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{
    api::{Api, PostParams},
    Client,
};

/// The API group of the agent's access rules (the group of its `lifecycle.dev/probes` annotation).
pub(crate) const GROUP: &str = "lifecycle.dev";

/// What a request reads, as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AccessRequest {
    /// Every container and pod on the node (`/api/v1/containers`): `list` on `containers`,
    /// cluster-wide.
    ListContainers,
    /// One pod's probe answers (`/api/v1/probe/<namespace>/<pod>/...`): `get` on `probes`, named
    /// after the pod, in its namespace.
    GetProbe { namespace: String, pod: String },
    /// `/metrics` with `--metrics-auth kubernetes`: `get` on the non-resource URL `/metrics`, the
    /// permission Prometheus' service accounts already have for the kubelet's and the API
    /// server's own metrics (as kube-rbac-proxy asks).
    GetMetrics,
}

impl AccessRequest {
    fn resource_attributes(&self) -> Option<ResourceAttributes> {
        let (verb, resource, namespace, name) = match self {
            Self::ListContainers => ("list", "containers", None, None),
            Self::GetProbe { namespace, pod } => ("get", "probes", Some(namespace.clone()), Some(pod.clone())),
            Self::GetMetrics => return None,
        };
        Some(ResourceAttributes {
            group: Some(GROUP.to_owned()),
            resource: Some(resource.to_owned()),
            verb: Some(verb.to_owned()),
            namespace,
            name,
            ..ResourceAttributes::default()
        })
    }

    fn non_resource_attributes(&self) -> Option<NonResourceAttributes> {
        matches!(self, Self::GetMetrics)
            .then(|| NonResourceAttributes { path: Some("/metrics".to_owned()), verb: Some("get".to_owned()) })
    }
}

/// What the API server said about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The token is not valid (unknown, expired, or for another audience).
    Unauthenticated,
    /// A valid token whose user may not `get` the path.
    Denied { user: String },
    /// A valid token whose user may `get` the path.
    Allowed { user: String },
}

/// Checks `token` — issued for one of `audiences`, when any are given: a token minted for the
/// agent (`kubectl create token --audience`) is then useless against the API server if it leaks,
/// and an API server token is refused here — and then whether its user may do `request`.
pub(crate) async fn review(
    client: &Client,
    token: &str,
    audiences: &[String],
    request: &AccessRequest,
) -> Result<Access, kube::Error> {
    let wanted = request;
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let audiences = (!audiences.is_empty()).then(|| audiences.to_vec());
    let request =
        TokenReview { spec: TokenReviewSpec { token: token.to_owned(), audiences }, ..TokenReview::default() };
    let answer = reviews.create(&PostParams::default(), &request).await?;
    let status = answer.status.unwrap_or_default();
    let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
        return Ok(Access::Unauthenticated);
    };
    // The API server names the audiences the token is good for among those asked: none of ours,
    // no entry (an authenticator that ignores audiences answers with the token's own).
    if let Some(wanted_audiences) = &request.spec.audiences {
        let granted = status.audiences.unwrap_or_default();
        if !granted.iter().any(|a| wanted_audiences.contains(a)) {
            return Ok(Access::Unauthenticated);
        }
    }
    let name = user.username.clone().unwrap_or_default();
    let access: Api<SubjectAccessReview> = Api::all(client.clone());
    let request = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username,
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            non_resource_attributes: wanted.non_resource_attributes(),
            resource_attributes: wanted.resource_attributes(),
        },
        ..SubjectAccessReview::default()
    };
    let answer = access.create(&PostParams::default(), &request).await?;
    let allowed = answer.status.is_some_and(|s| s.allowed);
    Ok(if allowed { Access::Allowed { user: name } } else { Access::Denied { user: name } })
}
