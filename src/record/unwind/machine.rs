//! The two things an in-process unwinder cannot do without `unsafe`: read the CPU's registers
//! where a stack walk starts, and read a word of the current thread's own stack. Everything
//! else about unwinding (which modules, their unwind tables, the walk itself) is safe code in
//! the parent module and in framehop.
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

/// The current thread's stack: the readable mapping that holds its stack pointer. Not `Send`:
/// it only ever reads the stack of the thread that found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stack {
    start: u64,
    end: u64,
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Stack {
    /// The current thread's stack, from `/proc/self/maps` (`None` where that cannot be read).
    pub(crate) fn current() -> Option<Stack> {
        let sp = registers().sp;
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        maps.lines().find_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let (a, b) = range.split_once('-')?;
            let (start, end) = (u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?);
            (perms.starts_with('r') && start <= sp && sp < end).then_some(Stack {
                start,
                end,
                _this_thread: std::marker::PhantomData,
            })
        })
    }

    /// Whether `sp` lies in it.
    pub(crate) fn holds(&self, sp: u64) -> bool {
        self.start <= sp && sp < self.end
    }

    /// The aligned word at `addr`, when it lies inside the stack; `Err` otherwise.
    #[inline]
    pub(crate) fn read(&self, addr: u64) -> Result<u64, ()> {
        if !addr.is_multiple_of(8) || addr < self.start || addr.checked_add(8).is_none_or(|e| e > self.end) {
            return Err(());
        }
        // SAFETY: `addr` is 8-aligned and its 8 bytes lie inside the readable mapping that held
        // this thread's stack pointer when `current` looked (checked just above). `Stack` is not
        // `Send`, so this is that same thread, and a thread's stack stays mapped while it runs.
        // A volatile read: the compiler knows nothing of the value.
        Ok(unsafe { std::ptr::read_volatile(addr as usize as *const u64) })
    }
}
