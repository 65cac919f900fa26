// RUN: cse
// Attributes must be the same value: 0.0 and -0.0 differ, as do axes [0] and [1]; equal
// dense constants merge.
graph @f(%x: f32[2,3]) -> (f32[3], f32[3], f32[2], f32[2,3], f32[2,3], f32[2,3], f32[2,3]) {
  %0 = sum(%x) {axes=[0]} : f32[3]
  %1 = sum(%x) {axes=[0]} : f32[3]
  %2 = sum(%x) {axes=[1]} : f32[2]
  %3 = full() {shape=[2, 3], value=0.0} : f32[2,3]
  %4 = full() {shape=[2, 3], value=-0.0} : f32[2,3]
  %5 = constant() {value=dense<f32[2,3], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]>} : f32[2,3]
  %6 = constant() {value=dense<f32[2,3], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]>} : f32[2,3]
  %7 = div(%x, %3) : f32[2,3]
  %8 = div(%x, %4) : f32[2,3]
  return %0, %1, %2, %7, %8, %5, %6
}
// EXPECT:
graph @f(%x: f32[2,3]) -> (f32[3], f32[3], f32[2], f32[2,3], f32[2,3], f32[2,3], f32[2,3]) {
  %0 = sum(%x) {axes=[0]} : f32[3]
  %1 = sum(%x) {axes=[1]} : f32[2]
  %2 = full() {shape=[2, 3], value=0.0} : f32[2,3]
  %3 = full() {shape=[2, 3], value=-0.0} : f32[2,3]
  %4 = constant() {value=dense<f32[2,3], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]>} : f32[2,3]
  %5 = div(%x, %2) : f32[2,3]
  %6 = div(%x, %3) : f32[2,3]
  return %0, %0, %1, %5, %6, %4, %4
}
