//! The Kubernetes API as the source of each pod's spec and reported status: [`convert`] decodes
//! Pod objects into the model's facts (pure), [`watch`] connects and watches this node's pods and
//! the kubelet's kill events.

pub mod convert;
pub mod watch;
