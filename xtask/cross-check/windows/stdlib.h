/* Stand-in for the Windows SDK's header, for the checks tier's type check of the kubectl plugin
 * for x86_64-pc-windows-msvc on a Linux machine (xtask/src/cross.rs): ring's C includes it for
 * _byteswap_ulong, a builtin of clang in MSVC mode. A build on Windows uses the SDK's. Nothing
 * compiled with it is linked. */
