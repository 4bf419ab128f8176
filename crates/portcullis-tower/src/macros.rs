//! The boilerplate both layers share (as tower-http writes its own with
//! `define_inner_service_accessors!`): a layer is an `Arc` of the state its
//! services share (`shared_layer!`: `Clone`, `Debug`, `Layer`), and a
//! service is its inner service beside that `Arc` (`layer_service!`: the
//! constructor, the inner-service accessors, `Clone`, `Debug`). Declared
//! first in `lib.rs`, so every module may use them; they import nothing.

/// A layer `$layer<St, K = PeerIp>` holding `Arc<$shared<St, K>>` in the
/// field `shared` (visible to the layer's module, so its builder can make
/// one), cloned cheaply, debugged as its shared state, and making
/// `$service`s.
macro_rules! shared_layer {
    ($(#[$attr:meta])* $layer:ident, $service:ident, $shared:ident) => {
        $(#[$attr])*
        pub struct $layer<St, K = crate::key::PeerIp> {
            pub(super) shared: ::std::sync::Arc<$shared<St, K>>,
        }

        impl<St, K> ::std::clone::Clone for $layer<St, K> {
            fn clone(&self) -> Self {
                Self {
                    shared: ::std::sync::Arc::clone(&self.shared),
                }
            }
        }

        impl<St, K> ::std::fmt::Debug for $layer<St, K> {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Debug::fmt(&*self.shared, f)
            }
        }

        impl<S, St, K> ::tower_layer::Layer<S> for $layer<St, K> {
            type Service = $service<S, St, K>;

            fn layer(&self, inner: S) -> Self::Service {
                $service::new(inner, ::std::sync::Arc::clone(&self.shared))
            }
        }
    };
}

/// A service `$service<S, St, K>`: the inner service `inner` and the
/// layer's `Arc<$shared<St, K>>` in `shared`, with `new`, `get_ref`,
/// `get_mut`, `into_inner`, `Clone` (when the inner service is) and `Debug`.
macro_rules! layer_service {
    ($(#[$attr:meta])* $service:ident, $shared:ident) => {
        $(#[$attr])*
        pub struct $service<S, St, K> {
            inner: S,
            shared: ::std::sync::Arc<$shared<St, K>>,
        }

        impl<S, St, K> $service<S, St, K> {
            pub(crate) fn new(inner: S, shared: ::std::sync::Arc<$shared<St, K>>) -> Self {
                Self { inner, shared }
            }

            /// The inner service.
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The inner service, mutably.
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// The inner service, consuming this one.
            pub fn into_inner(self) -> S {
                self.inner
            }
        }

        impl<S: ::std::clone::Clone, St, K> ::std::clone::Clone for $service<S, St, K> {
            fn clone(&self) -> Self {
                Self {
                    inner: self.inner.clone(),
                    shared: ::std::sync::Arc::clone(&self.shared),
                }
            }
        }

        impl<S: ::std::fmt::Debug, St, K> ::std::fmt::Debug for $service<S, St, K> {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($service))
                    .field("inner", &self.inner)
                    .field("layer", &*self.shared)
                    .finish()
            }
        }
    };
}
