//! [`Element`]: the types whose bytes may be copied between host and device. It sits below
//! both the device buffers and the CUDA backend's copies, which rely on its guarantee.
#![forbid(unsafe_code)]

mod sealed {
    pub trait Sealed {}
}

/// Element types whose contents can be copied between host and device: the integer and
/// floating-point primitives and arrays of them.
///
/// Every bit pattern is a valid value of each of them and none has padding, which is what makes
/// reading device memory (possibly never written, or written by a kernel) into them sound. The
/// trait is sealed for that reason: the CUDA backend's copies rely on it. Buffers of other
/// `Copy` types can still be allocated and lent to cudarc, whose `DeviceRepr` contract covers
/// them.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The all-zero-bits value.
    const ZERO: Self;
}

macro_rules! element {
    ($($t:ty => $z:expr),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const ZERO: Self = $z;
        }
    )*};
}

element!(
    u8 => 0, u16 => 0, u32 => 0, u64 => 0, u128 => 0, usize => 0,
    i8 => 0, i16 => 0, i32 => 0, i64 => 0, i128 => 0, isize => 0,
    f32 => 0.0, f64 => 0.0,
);

impl<T: Element, const N: usize> sealed::Sealed for [T; N] {}
impl<T: Element, const N: usize> Element for [T; N] {
    const ZERO: Self = [T::ZERO; N];
}
