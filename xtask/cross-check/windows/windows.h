/* Stand-in for the Windows SDK's header, for the checks tier's type check of the kubectl plugin
 * for x86_64-pc-windows-msvc on a Linux machine (xtask/src/cross.rs): stacker's C (under kube's
 * JSONPath parser) includes it for GetCurrentFiber alone. A build on Windows uses the SDK's.
 * Nothing compiled with it is linked. */
typedef void *PVOID;
PVOID GetCurrentFiber(void);
