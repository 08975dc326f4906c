/* Stand-in for the macOS SDK's header, for the checks tier's type check of the kubectl plugin
 * for aarch64-apple-darwin on a Linux machine (xtask/src/cross.rs): ring's C includes it for the
 * TARGET_OS_* macros alone. A build on a Mac uses the SDK's. Nothing compiled with it is linked. */
#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 1
#define TARGET_OS_IPHONE 0
