//! The three things an in-process unwinder cannot do without `unsafe`: read the CPU's registers
//! where a stack walk starts, ask the thread library where the current thread's stack lies, and
//! read a word of that stack between the walk's stack pointer and the stack's top (never
//! outside: every read is checked against those bounds first). Everything else about unwinding
//! (which modules, their unwind tables, the walk itself) is safe code in the parent module and
//! in framehop.
//!
//! This module and `device/cuda/` and `notebook/anchor.rs` are the only places with `unsafe`
//! code (`tests/layers.rs` checks it).

/// The registers a walk starts from: the instruction pointer, the stack pointer and the frame
/// pointer (`rbp` on x86_64, `x29` on aarch64), with the link register on aarch64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    /// aarch64's link register (0 elsewhere).
    pub lr: u64,
}

/// Whether this architecture has a register reader (otherwise stacks come from the slower
/// portable unwinder).
pub(crate) const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// The registers at this point of the caller's frame. Always inlined: the values are those of
/// the function that calls it, whose unwind rules then apply to them.
#[inline(always)]
pub(crate) fn registers() -> Regs {
    #[cfg(target_arch = "x86_64")]
    {
        let (pc, sp, fp): (u64, u64, u64);
        // SAFETY: reads three registers into outputs; touches no memory, no stack, no flags.
        unsafe {
            std::arch::asm!(
                "lea {pc}, [rip]",
                "mov {sp}, rsp",
                "mov {fp}, rbp",
                pc = out(reg) pc,
                sp = out(reg) sp,
                fp = out(reg) fp,
                options(nomem, nostack, preserves_flags),
            );
        }
        Regs { pc, sp, fp, lr: 0 }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let (pc, sp, fp, lr): (u64, u64, u64, u64);
        // SAFETY: reads four registers into outputs; touches no memory, no stack, no flags.
        unsafe {
            std::arch::asm!(
                "adr {pc}, .",
                "mov {sp}, sp",
                "mov {fp}, x29",
                "mov {lr}, x30",
                pc = out(reg) pc,
                sp = out(reg) sp,
                fp = out(reg) fp,
                lr = out(reg) lr,
                options(nomem, nostack, preserves_flags),
            );
        }
        Regs { pc, sp, fp, lr }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Regs::default()
    }
}

/// The current thread's stack, as its thread library allocated it: `[low, high)`. Not `Send`
/// (nor `Sync`): it only ever reads the stack of the thread that found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stack {
    low: u64,
    high: u64,
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Stack {
    /// The current thread's stack (glibc's or musl's `pthread_getattr_np`); `None` where that
    /// cannot be asked (then stacks come from the portable unwinder).
    #[cfg(target_os = "linux")]
    pub(crate) fn current() -> Option<Stack> {
        use nix::libc;
        let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
        let (mut addr, mut size): (*mut libc::c_void, libc::size_t) = (std::ptr::null_mut(), 0);
        // SAFETY: `pthread_getattr_np` initialises `attr` for the calling thread (its own
        // handle, valid while it runs) and returns 0 when it did; only then is `attr` read, by
        // `pthread_attr_getstack` into two locals, and destroyed once. Nothing else is touched.
        let ok = unsafe {
            if libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) != 0 {
                return None;
            }
            let r = libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size);
            libc::pthread_attr_destroy(attr.as_mut_ptr());
            r == 0
        };
        let low = addr as usize as u64;
        let high = low.checked_add(size as u64)?;
        (ok && size > 0).then_some(Stack { low, high, _this_thread: std::marker::PhantomData })
    }

    /// Elsewhere: no stack bounds, so no fast walk.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn current() -> Option<Stack> {
        None
    }

    /// The part of this stack a walk starting at stack pointer `sp` may read: from `sp` up to
    /// the stack's top, the frames of the functions that called the walk (the stack grows down
    /// on both architectures with a register reader). `None` when `sp` is not on this stack (an
    /// alternate signal stack, a coroutine's own stack).
    pub(crate) fn live_from(&self, sp: u64) -> Option<LiveStack<'_>> {
        (self.low <= sp && sp < self.high).then_some(LiveStack { start: sp, end: self.high, _stack: self })
    }
}

/// The live part of the current thread's stack during one walk: its callers' frames, which stay
/// in place until the walk returns. Borrowed from a [`Stack`], so neither `Send` nor `Sync`.
pub(crate) struct LiveStack<'s> {
    start: u64,
    end: u64,
    _stack: &'s Stack,
}

impl LiveStack<'_> {
    /// The aligned word at `addr`, when it lies in the live stack; `Err` otherwise.
    #[inline]
    pub(crate) fn read(&self, addr: u64) -> Result<u64, ()> {
        if !addr.is_multiple_of(8) || addr < self.start || addr.checked_add(8).is_none_or(|e| e > self.end) {
            return Err(());
        }
        // SAFETY: `addr` is 8-aligned and its 8 bytes lie between the stack pointer the walk
        // started from and the top of the calling thread's own stack (checked just above; the
        // bounds come from the thread library, `Stack::current`). That range is mapped and
        // holds the frames of the functions that are now waiting for the walk to return, so it
        // stays mapped and in place for as long as `self` lives, and `self` cannot leave this
        // thread. What the unwinder asks for are return addresses and saved registers, which
        // only this thread writes; a word some caller lent to another thread could change as it
        // is read, which yields a wrong value (a wrong frame at worst, never a read outside the
        // range). A volatile read: the compiler assumes nothing about the value.
        Ok(unsafe { std::ptr::read_volatile(addr as usize as *const u64) })
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Reads a word of this frame through the bounded reader, and is refused everything outside
    /// `[sp, top)` of the calling thread's stack.
    fn reads_stay_on_this_stack() {
        let here = std::hint::black_box(0x5eed_u64 ^ 0xdead_beef_0000);
        let at = std::hint::black_box(&here) as *const u64 as usize as u64;
        let stack = Stack::current().expect("this thread's stack");
        let sp = registers().sp;
        assert!(stack.low <= sp && sp < stack.high, "{stack:?} holds sp {sp:#x}");
        let live = stack.live_from(sp).expect("sp is on the stack");
        assert!(sp <= at && at < stack.high, "a local lies above the stack pointer");
        assert_eq!(live.read(at), Ok(here));
        assert_eq!(live.read(sp.wrapping_sub(8) & !7), Err(()), "below the stack pointer");
        assert_eq!(live.read(stack.high), Err(()), "past the top");
        assert_eq!(live.read(stack.high - 4), Err(()), "straddles the top");
        assert_eq!(live.read(at + 1), Err(()), "unaligned");
        assert!(stack.live_from(stack.high).is_none() && stack.live_from(stack.low.wrapping_sub(8)).is_none());
    }

    #[test]
    fn the_test_thread_and_a_spawned_thread_read_only_their_own_stack() {
        reads_stay_on_this_stack();
        let main_stack = Stack::current().unwrap();
        let other = std::thread::spawn(|| {
            reads_stay_on_this_stack();
            let s = Stack::current().unwrap();
            (s.low, s.high)
        })
        .join()
        .unwrap();
        assert!(other.1 <= main_stack.low || other.0 >= main_stack.high, "two threads, two stacks");
    }
}
