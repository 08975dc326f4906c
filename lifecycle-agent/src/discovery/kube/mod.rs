//! The Kubernetes API as the source of each pod's spec and reported status: [`convert`] decodes
//! Pod objects into the model's facts (pure), [`watch`] connects and watches this node's pods and
//! the kubelet's kill events, [`review`] asks it who holds a bearer token and what they may read;
//! [`words`] says what went wrong with it in one line.

pub mod convert;
pub(crate) mod review;
pub(crate) mod watch;
pub(crate) mod words;
