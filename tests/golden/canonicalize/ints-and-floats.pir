// RUN: canonicalize
// x - x and x * 0 are 0 for integers; for floats NaN and infinities make them NaN, so they
// stay (see fast-math.pir). Rules whose replacement would wrap differently do not fire:
// u8 negation wraps in 8 bits, so x + (-y) is not x - y once promoted to i32.
graph @f(
    %i: i32[3],
    %x: f32[3],
    %u: u8[3],
    %j: i32[3]
) -> (i32[3], i32[3], f32[3], f32[3], i32[3], i32[3]) {
  %z = full() {shape=[3], value=0, dtype=i32} : i32[3]
  %0 = sub(%i, %i) : i32[3]
  %1 = mul(%z, %i) : i32[3]
  %2 = sub(%x, %x) : f32[3]
  %fz = full() {shape=[3], value=0.0} : f32[3]
  %3 = mul(%x, %fz) : f32[3]
  %n = neg(%u) : u8[3]
  %4 = add(%j, %n) : i32[3]
  %m = neg(%j) : i32[3]
  %5 = add(%i, %m) : i32[3]
  return %0, %1, %2, %3, %4, %5
}
// EXPECT:
graph @f(
    %i: i32[3],
    %x: f32[3],
    %u: u8[3],
    %j: i32[3]
) -> (i32[3], i32[3], f32[3], f32[3], i32[3], i32[3]) {
  %0 = full() {shape=[3], value=0, dtype=i32} : i32[3]
  %1 = full() {shape=[3], value=0, dtype=i32} : i32[3]
  %2 = sub(%x, %x) : f32[3]
  %fz = full() {shape=[3], value=0.0} : f32[3]
  %3 = mul(%x, %fz) : f32[3]
  %n = neg(%u) : u8[3]
  %4 = add(%j, %n) : i32[3]
  %5 = sub(%i, %j) : i32[3]
  return %0, %1, %2, %3, %4, %5
}
